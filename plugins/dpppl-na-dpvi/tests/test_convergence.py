"""The drift test tells a settled trace from one that has not reached its optimum."""

from __future__ import annotations

import json

import numpy as np
import pymc as pm
import pytest
from scipy import signal

import dpppl
from dpppl_na_dpvi.convergence import (
    DRIFT_LIMIT,
    FEW_RELAXATIONS,
    SETTLE_GRID,
    SETTLED_LIMIT,
    drift_scores,
    drift_warning,
    settled_start,
)


def ornstein_uhlenbeck(rng, steps, rate=0.01, d=3, trend=0.0):
    """An SGD-like AR(1) trace around 0 (relaxation rate ``rate``, unit stationary variance),
    plus a linear drift of ``trend`` over the whole trace."""
    shocks = rng.normal(size=(steps + 1, d)) * np.sqrt(rate * (2 - rate))
    shocks[0] = rng.normal(size=d)  # start in the stationary distribution
    phi = signal.lfilter([1.0], [1.0, rate - 1.0], shocks, axis=0)
    return phi + trend * np.arange(steps + 1)[:, None] / steps


def test_a_stationary_trace_scores_like_a_standard_normal():
    rng = np.random.default_rng(0)
    scores = np.concatenate(
        [drift_scores(ornstein_uhlenbeck(rng, 8000), burn_in=0) for _ in range(100)]
    )
    assert abs(scores.mean()) < 0.25
    assert 0.7 < scores.std() < 1.5
    assert np.abs(scores).max() < DRIFT_LIMIT


def test_a_settled_trace_that_relaxes_as_slowly_as_na_dpvis_is_rarely_flagged():
    # NA-DPVI's step-size rule relaxes the trace by about 0.2 % per step, over 8000 steps after
    # the burn-in; a fit has 2n coordinates.  Batch means of 267 steps flagged 46 % of such
    # stationary traces of 8 coordinates, and the AR(1) fit without its bias correction 3 %.
    rng = np.random.default_rng(5)
    flagged = [
        np.abs(drift_scores(ornstein_uhlenbeck(rng, 8000, rate=0.002, d=8), 0)).max() > DRIFT_LIMIT
        for _ in range(200)
    ]
    assert np.mean(flagged) <= 0.02


def test_a_trace_still_moving_towards_its_optimum_is_flagged_with_what_to_change():
    rng = np.random.default_rng(1)
    scores = drift_scores(ornstein_uhlenbeck(rng, 8000, trend=5.0), burn_in=0)
    assert np.all(np.abs(scores) > DRIFT_LIMIT)
    message = drift_warning(scores, ["mu[a]", "mu[b]", "u[a]"])
    assert "has not settled" in message and "more steps" in message
    assert drift_warning(np.array([0.5, -1.0]), ["mu[a]", "u[a]"]) is None


def test_a_drifting_trace_whose_rates_the_noise_bounds_is_told_more_steps_will_not_help():
    """Wander-bounded rates span a number of relaxation times fixed by ε, N and n: below
    FEW_RELAXATIONS the advice is a larger epsilon or faster rates (on the 10-D regression at
    ε = 0.1, 0.6 relaxation times at 10 000 steps and at 40 000)."""
    scores = np.array([0.5, -9.6])
    message = drift_warning(scores, ["mu[a]", "u[a]"], bounded_relaxations=0.6)
    assert "u[a] drifts by -9.6" in message
    assert "0.6 relaxation times" in message and "larger epsilon" in message
    assert "more steps" not in message
    settled_enough = drift_warning(scores, ["mu[a]", "u[a]"], bounded_relaxations=FEW_RELAXATIONS)
    assert "more steps" in settled_enough


def test_a_trace_still_approaching_its_optimum_is_flagged_unless_the_burn_in_covers_it():
    # Started 30 stationary standard deviations away, relaxing 0.2 % per step: over the first
    # 8000 steps it is still on its way; after a 2000-step burn-in it has arrived.
    rng = np.random.default_rng(2)
    approach = 30 * np.exp(-0.002 * np.arange(10_001))[:, None]
    traces = [ornstein_uhlenbeck(rng, 10_000, rate=0.002) + approach for _ in range(20)]
    flagged = [np.abs(drift_scores(phi[:8001], burn_in=0)).max() > DRIFT_LIMIT for phi in traces]
    settled = [np.abs(drift_scores(phi, burn_in=2000)).max() > DRIFT_LIMIT for phi in traces]
    assert np.mean(flagged) >= 0.7
    assert not any(settled)


def test_a_stationary_trace_is_read_whole():
    rng = np.random.default_rng(6)
    starts = [settled_start(ornstein_uhlenbeck(rng, 8000, rate=0.002, d=8)) for _ in range(100)]
    # 8 coordinates within SETTLED_LIMIT = 3 at once: about 2 % of such traces lose a tenth.
    assert np.mean(np.array(starts) == 0) >= 0.9


def test_the_steps_still_approaching_the_optimum_are_left_out():
    # 30 stationary sds away at the start, relaxing 0.2 % per step: e^(-0.002 t) · 30 is below
    # one sd after about 1700 steps, and the drift test can tell from about there on.
    rng = np.random.default_rng(7)
    approach = 30 * np.exp(-0.002 * np.arange(8000))[:, None]
    for _ in range(10):
        phi = ornstein_uhlenbeck(rng, 7999, rate=0.002) + approach
        start = settled_start(phi)
        assert 800 <= start <= 4000
        assert np.abs(drift_scores(phi, start)).max() <= SETTLED_LIMIT


def test_a_trace_that_never_settles_keeps_its_second_half_or_on_request_all_of_it():
    rng = np.random.default_rng(8)
    phi = ornstein_uhlenbeck(rng, 7999, trend=20.0)
    assert settled_start(phi) == len(phi) // SETTLE_GRID * (SETTLE_GRID // 2)
    assert settled_start(phi, halve_unsettled=False) == 0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_fit_releases_the_scores_beside_its_trace():
    x = np.random.default_rng(3).binomial(1, 0.3, 1000)
    with pm.Model():
        p = pm.Beta("p", 2, 2)
        pm.Bernoulli("x", p, observed=x)
        result = dpppl.sample(mechanism="na-dpvi", epsilon=1.0, delta=1e-5, steps=600,
                              posterior="naive", random_seed=4, progressbar=False)
    trace = result["dpvi_trace"]
    attrs = json.loads(result.attrs["dp_mechanism_attrs"])
    phi = trace["phi"].values
    # One parameter: standardised rates, so a trace no cut settles is read whole.
    assert attrs["settled_step"] == attrs["burn_in_steps"] + settled_start(
        phi[attrs["burn_in_steps"] : -1], halve_unsettled=False
    )
    np.testing.assert_allclose(trace["drift_score"].values,
                               drift_scores(phi, attrs["settled_step"]))
