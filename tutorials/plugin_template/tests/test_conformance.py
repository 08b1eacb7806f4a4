"""The template passes dpppl's conformance suite.  Keep this file in your plugin."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

from dpppl.testing import mechanism_checks


def normal_mean(rng: np.random.Generator) -> pm.Model:
    """The model the mechanism supports, with float records in pm.Data (so the suite's leak and
    NaN checks apply)."""
    with pm.Model(coords={"obs": range(50)}) as model:
        y = pm.Data("y_data", rng.normal(1.3, 1.0, 50), dims="obs")
        mu = pm.Normal("mu", 0.0, 3.0)
        pm.Normal("y", mu, 1.0, observed=y, dims="obs")
    return model


@pytest.mark.parametrize(
    "check", mechanism_checks("noisy-mean", options={"draws": 200}, model=normal_mean), ids=str
)
def test_noisy_mean_keeps_the_mechanism_contract(check):
    skipped = check()
    if skipped:
        pytest.skip(skipped)
