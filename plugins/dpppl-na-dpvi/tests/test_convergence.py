"""The drift test tells a settled trace from one that has not reached its optimum."""

from __future__ import annotations

import json

import numpy as np
import pymc as pm
import pytest

import dpppl
from dpppl_na_dpvi.convergence import DRIFT_LIMIT, drift_scores, drift_warning


def ornstein_uhlenbeck(rng, steps, rate=0.01, d=3, trend=0.0):
    """An SGD-like AR(1) trace around 0 (relaxation rate ``rate``), plus a linear drift."""
    phi = np.zeros((steps + 1, d))
    for t in range(steps):
        phi[t + 1] = (1 - rate) * phi[t] + rng.normal(size=d) * np.sqrt(2 * rate)
    return phi + trend * np.arange(steps + 1)[:, None] / steps


def test_a_stationary_trace_scores_like_a_standard_normal():
    rng = np.random.default_rng(0)
    scores = np.concatenate(
        [drift_scores(ornstein_uhlenbeck(rng, 8000), burn_in=0) for _ in range(100)]
    )
    assert abs(scores.mean()) < 0.25
    assert 0.7 < scores.std() < 1.5
    assert np.abs(scores).max() < DRIFT_LIMIT


def test_a_trace_still_moving_towards_its_optimum_is_flagged_with_what_to_change():
    rng = np.random.default_rng(1)
    scores = drift_scores(ornstein_uhlenbeck(rng, 8000, trend=5.0), burn_in=0)
    assert np.all(np.abs(scores) > DRIFT_LIMIT)
    message = drift_warning(scores, ["mu[a]", "mu[b]", "u[a]"])
    assert "has not settled" in message and "more steps" in message
    assert drift_warning(np.array([0.5, -1.0]), ["mu[a]", "u[a]"]) is None


def test_only_the_steps_after_the_burn_in_count():
    rng = np.random.default_rng(2)
    settled = ornstein_uhlenbeck(rng, 6000)
    travelling = np.linspace(30.0, 0.0, 2000)[:, None] + settled[:2000]
    phi = np.concatenate([travelling, settled])
    assert np.abs(drift_scores(phi, burn_in=0)).max() > DRIFT_LIMIT
    assert np.abs(drift_scores(phi, burn_in=2000)).max() < DRIFT_LIMIT


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_fit_releases_the_scores_beside_its_trace():
    x = np.random.default_rng(3).binomial(1, 0.3, 1000)
    with pm.Model():
        p = pm.Beta("p", 2, 2)
        pm.Bernoulli("x", p, observed=x)
        result = dpppl.sample(mechanism="na-dpvi", epsilon=1.0, delta=1e-5, steps=600,
                              posterior="naive", random_seed=4, progressbar=False)
    trace = result["dpvi_trace"]
    burn_in = json.loads(result.attrs["dp_mechanism_attrs"])["burn_in_steps"]
    np.testing.assert_allclose(trace["drift_score"].values,
                               drift_scores(trace["phi"].values, burn_in))
