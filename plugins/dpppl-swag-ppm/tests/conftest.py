"""Models and settings shared by the SWAG-PPM tests."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest


def logistic_model(n_records: int = 400, seed: int = 0) -> pm.Model:
    """Logistic regression on two features with distinctive covariate values."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_records, 2)) + np.pi  # no record value is a round number
    logits = x @ np.array([1.0, -1.0]) - 0.5
    y = (rng.random(n_records) < 1 / (1 + np.exp(-logits))).astype(np.int64)
    with pm.Model(coords={"obs": range(n_records), "feature": ["a", "b"]}) as model:
        features = pm.Data("x", x, dims=("obs", "feature"))
        w = pm.Normal("w", 0, 1, dims="feature")
        b = pm.Normal("b", 0, 2)
        pm.Bernoulli("y", logit_p=features @ w + b, observed=y, dims="obs")
    return model


@pytest.fixture(scope="module")
def logistic():
    return logistic_model()


@pytest.fixture(scope="session")
def logistic_of_size():
    """Builds :func:`logistic_model` with a given number of records (neighbours differ by one)."""
    return lambda n_records: logistic_model(n_records=n_records)


@pytest.fixture(scope="session")
def fast():
    """Small settings that keep a whole SWAG-PPM fit to about a second."""
    return {"warmup_epochs": 20, "swag_epochs": 20, "risk_draws": 200}
