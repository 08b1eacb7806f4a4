"""The three accountants against exact answers and against each other, within their stated error.

``prv`` depends on the dp-accounting plugin, so the cross-checks of all three live here.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

from dpppl.plugin import (
    GaussianEvent,
    NeighbourRelation,
    SelfComposedEvent,
    UnsupportedEventError,
    get_accountant,
)
from dpppl.plugin import poisson_subsampled_gaussian as dp_sgd
from dpppl.testing import subsampled_gaussian_epsilon_bounds
from dpppl_prv.accountant import DELTA_ERROR_FRACTION, eps_error
from dpppl_prv.bounds import epsilon_bounds
from dpppl_prv.composition import composition_of

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE
RDP, PLD, PRV = (get_accountant(name)() for name in ("rdp", "pld", "prv"))


def gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact δ(ε) of a μ-Gaussian mechanism (Balle & Wang 2018)."""
    return norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)


def gaussian_epsilon(delta: float, mu: float) -> float:
    return brentq(lambda epsilon: gaussian_delta(epsilon, mu) - delta, 0.0, 100.0, xtol=1e-14)


# Allowed looseness over the exact ε: RDP's conversion is lossy; PLD is pessimistic by its grid;
# PRV adds 1 % of the RDP bound.
LOOSENESS = {"rdp": 0.15, "pld": 1e-4, "prv": 0.02}


@pytest.mark.parametrize("accountant", [RDP, PLD, PRV], ids=lambda a: a.name)
@pytest.mark.parametrize("relation", list(NeighbourRelation), ids=lambda r: r.value)
@pytest.mark.parametrize(("sigma", "steps"), [(10.0, 100), (1.0, 1), (300.0, 10_000)])
def test_gaussian_compositions_are_bounded_by_the_exact_answer(accountant, relation, sigma, steps):
    # q = 1: T Gaussian releases are one Gaussian with μ = √T/σ, whatever the relation, since
    # noise multipliers are relative to the sensitivity under the declared relation.
    mu = math.sqrt(steps) / sigma
    event = SelfComposedEvent(GaussianEvent(sigma), steps)
    exact = gaussian_epsilon(1e-5, mu)
    bound = accountant.epsilon(event, delta=1e-5, relation=relation)
    assert exact <= bound <= exact * (1 + LOOSENESS[accountant.name])
    assert accountant.delta(event, epsilon=exact, relation=relation) >= 1e-5 * (1 - 1e-9)


def prv_answers(compute):
    """``compute()``, or a rejected example where prv-accountant 0.2.0 fails numerically (issue #36,
    a refusal that test_bounds.py checks on its own)."""
    try:
        return compute()
    except UnsupportedEventError as error:
        if "prv-accountant 0.2.0 failed" not in str(error):
            raise
        reject()


cheap_noise = st.floats(0.8, 10.0)
cheap_rate = st.floats(1e-3, 0.2)
cheap_steps = st.integers(1, 1000)
delta = st.sampled_from([1e-5, 1e-6])


@settings(max_examples=4, deadline=None, derandomize=True)
@given(sigma=cheap_noise, q=cheap_rate, steps=cheap_steps, d=delta)
def test_pld_lies_within_the_prv_bounds(sigma, q, steps, d):
    # Both are tight: PLD's pessimistic ε falls between PRV's lower and upper bound (at these
    # moderate ε; see the large-ε example below, where PRV's lower bound fails).
    composition = composition_of(dp_sgd(sigma, q, steps), ADD_REMOVE)
    lo, _, up = prv_answers(
        lambda: epsilon_bounds(
            composition,
            delta=d,
            eps_error=eps_error(composition, d),
            delta_error=DELTA_ERROR_FRACTION * d,
        )
    )
    assert lo <= PLD.epsilon(dp_sgd(sigma, q, steps), delta=d, relation=ADD_REMOVE) <= up


@settings(max_examples=4, deadline=None, derandomize=True)
@given(sigma=cheap_noise, q=cheap_rate, steps=cheap_steps, d=delta)
def test_rdp_is_never_tighter_than_either(sigma, q, steps, d):
    event = dp_sgd(sigma, q, steps)
    loose = RDP.epsilon(event, delta=d, relation=ADD_REMOVE)
    assert loose >= PLD.epsilon(event, delta=d, relation=ADD_REMOVE)
    tight = prv_answers(lambda: PRV.epsilon(event, delta=d, relation=ADD_REMOVE))
    assert loose >= tight - eps_error(composition_of(event, ADD_REMOVE), d)


@settings(max_examples=2, deadline=None, derandomize=True)
@given(sigma=cheap_noise, factor=st.floats(1.1, 3.0), q=cheap_rate, steps=cheap_steps)
def test_prv_epsilon_falls_with_noise_and_grows_with_rate_and_steps(sigma, factor, q, steps):
    def epsilon(s, r, t):
        return prv_answers(lambda: PRV.epsilon(dp_sgd(s, r, t), delta=1e-5, relation=ADD_REMOVE))

    base = epsilon(sigma, q, steps)
    assert epsilon(sigma * factor, q, steps) <= base
    assert epsilon(sigma, min(1.0, q * factor), steps) >= base
    assert epsilon(sigma, q, steps + 100) >= base


@settings(max_examples=2, deadline=None, derandomize=True)
@given(q=st.floats(1e-3, 0.1), steps=st.integers(10, 500), target=st.floats(0.3, 2.0))
def test_prv_calibration_never_overshoots_and_stays_within_one_percent(q, steps, target):
    def event_for(sigma):
        return dp_sgd(sigma, q, steps)

    sigma = prv_answers(
        lambda: PRV.noise_multiplier(event_for, epsilon=target, delta=1e-5, relation=ADD_REMOVE)
    )
    achieved = PRV.epsilon(event_for(sigma), delta=1e-5, relation=ADD_REMOVE)
    assert 0.99 * target <= achieved <= target


def test_at_a_large_epsilon_pld_is_exact_and_prv_keeps_its_upper_bound():
    """The example a random run of the test above found (2026-11-25): PRV's lower bound, 8.7065,
    lay above PLD's ε, 8.6934.  An independent bracket of the exact ε (the loss distribution
    rounded up and down, composed exactly; [8.6918, 8.6950] on a 2·10⁻⁵ grid) settles it: PLD is
    right, and PRV's *lower* bound is not a bound there (prv-accountant's error estimate at this
    ε is too small).  Its estimate and upper bound, which calibration uses, stay above the
    truth, so no guarantee is overstated."""
    sigma, q, steps, d = 1.25, 0.125, 162, 1e-6
    lower, upper = subsampled_gaussian_epsilon_bounds(sigma, q, steps, d)
    assert lower <= PLD.epsilon(dp_sgd(sigma, q, steps), delta=d, relation=ADD_REMOVE) <= upper
    composition = composition_of(dp_sgd(sigma, q, steps), ADD_REMOVE)
    prv_lower, estimate, prv_upper = epsilon_bounds(
        composition, delta=d, eps_error=eps_error(composition, d),
        delta_error=DELTA_ERROR_FRACTION * d,
    )
    assert prv_upper >= estimate >= lower
    assert PRV.epsilon(dp_sgd(sigma, q, steps), delta=d, relation=ADD_REMOVE) >= upper
    assert prv_lower > upper  # the upstream defect this example shows
