"""Small models with known posteriors, shared by the DP-SEP tests."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

PRIOR_MEAN = np.array([0.5, -1.0])
PRIOR_SD = np.array([2.0, 3.0])
NOISE_SD = 0.7


def regression_data(n_records: int, n_features: int, seed: int = 0):
    """Features with distinctive values and a linear-Gaussian response."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_records, n_features)) + np.pi / 7
    y = x @ np.array([1.2, -0.6])[:n_features] + rng.normal(size=n_records) * NOISE_SD
    return x, y


def linear_model(n_records: int = 60, n_features: int = 2) -> pm.Model:
    """Conjugate linear regression (known noise): the posterior is Gaussian in closed form."""
    x, y = regression_data(n_records, n_features)
    coords = {"obs": range(n_records), "feature": ["a", "b"][:n_features]}
    with pm.Model(coords=coords) as model:
        features = pm.Data("x", x, dims=("obs", "feature"))
        w = pm.Normal("w", PRIOR_MEAN[:n_features], PRIOR_SD[:n_features], dims="feature")
        pm.Normal("y", features @ w, NOISE_SD, observed=y, dims="obs")
    return model


def exact_posterior(n_records: int = 60, n_features: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of :func:`linear_model`'s posterior."""
    x, y = regression_data(n_records, n_features)
    prior_precision = np.diag(1 / PRIOR_SD[:n_features] ** 2)
    precision = prior_precision + x.T @ x / NOISE_SD**2
    covariance = np.linalg.inv(precision)
    mean = covariance @ (prior_precision @ PRIOR_MEAN[:n_features] + x.T @ y / NOISE_SD**2)
    return mean, covariance


def logistic_model(n_records: int = 50, n_features: int = 1, seed: int = 1) -> pm.Model:
    """Logistic regression: a non-conjugate likelihood for comparing moment-matching rules."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_records, n_features)) + 0.3
    logits = x @ np.array([1.5, -1.0])[:n_features]
    y = (rng.random(n_records) < 1 / (1 + np.exp(-logits))).astype(np.int64)
    with pm.Model(coords={"obs": range(n_records), "feature": range(n_features)}) as model:
        features = pm.Data("x", x, dims=("obs", "feature"))
        w = pm.Normal("w", 0, 2, dims="feature")
        pm.Bernoulli("y", logit_p=features @ w, observed=y, dims="obs")
    return model


@pytest.fixture(scope="session")
def linear_1d() -> pm.Model:
    return linear_model(n_features=1)


@pytest.fixture(scope="session")
def linear_2d() -> pm.Model:
    return linear_model(n_features=2)


@pytest.fixture(scope="session")
def exact_linear():
    """:func:`exact_posterior`, for the tests."""
    return exact_posterior


@pytest.fixture(scope="session")
def make_linear():
    """:func:`linear_model`, for tests that need other sizes."""
    return linear_model


@pytest.fixture(scope="session")
def logistic_1d() -> pm.Model:
    return logistic_model(n_features=1)


@pytest.fixture(scope="session")
def logistic_2d() -> pm.Model:
    return logistic_model(n_features=2)
