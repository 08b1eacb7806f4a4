"""Properties every accountant must have, checked on random DP-SGD settings with hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpppl.plugin import NeighbourRelation, poisson_subsampled_gaussian
from dpppl_dp_accounting.pld import PldAccountant
from dpppl_dp_accounting.rdp import RdpAccountant

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE
ACCOUNTANTS = [RdpAccountant(), PldAccountant()]

# Kept where PLD answers in a fraction of a second, so that the default test run stays fast.
noise = st.floats(2.0, 20.0)
rate = st.floats(1e-3, 0.2)
steps = st.integers(1, 500)
delta = st.sampled_from([1e-5, 1e-6, 1e-8])


def epsilon(accountant, sigma, q, t, d):
    event = poisson_subsampled_gaussian(sigma, q, t)
    return accountant.epsilon(event, delta=d, relation=ADD_REMOVE)


@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
@settings(max_examples=5, deadline=None)
@given(sigma=noise, q=rate, t=steps, more=st.integers(1, 500), d=delta)
def test_epsilon_grows_with_the_number_of_steps(accountant, sigma, q, t, more, d):
    assert epsilon(accountant, sigma, q, t + more, d) >= epsilon(accountant, sigma, q, t, d)


@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
@settings(max_examples=5, deadline=None)
@given(sigma=noise, q=rate, factor=st.floats(1.05, 3.0), t=steps, d=delta)
def test_epsilon_grows_with_the_sampling_rate(accountant, sigma, q, factor, t, d):
    larger = min(1.0, q * factor)
    assert epsilon(accountant, sigma, larger, t, d) >= epsilon(accountant, sigma, q, t, d)


@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
@settings(max_examples=5, deadline=None)
@given(sigma=noise, factor=st.floats(1.05, 3.0), q=rate, t=steps, d=delta)
def test_epsilon_falls_with_the_noise(accountant, sigma, factor, q, t, d):
    assert epsilon(accountant, sigma * factor, q, t, d) <= epsilon(accountant, sigma, q, t, d)


@settings(max_examples=6, deadline=None)
@given(sigma=noise, q=rate, t=steps, d=delta)
def test_rdp_is_never_tighter_than_pld(sigma, q, t, d):
    rdp, pld = ACCOUNTANTS
    assert epsilon(rdp, sigma, q, t, d) >= epsilon(pld, sigma, q, t, d)


@pytest.mark.parametrize("accountant", ACCOUNTANTS, ids=lambda a: a.name)
@settings(max_examples=2, deadline=None)
@given(
    # Where the answer is σ < 1 (tiny q·T) a PLD evaluation takes seconds; kept out for speed.
    q=st.floats(0.01, 0.1),
    t=st.integers(50, 500),
    target=st.floats(0.2, 2.0),
    d=delta,
    initial=st.floats(0.3, 300.0),
)
def test_calibration_never_overshoots_and_stays_within_one_percent(
    accountant, q, t, target, d, initial
):
    def event_for(sigma):
        return poisson_subsampled_gaussian(sigma, q, t)

    sigma = accountant.noise_multiplier(
        event_for, epsilon=target, delta=d, relation=ADD_REMOVE, initial=initial
    )
    achieved = accountant.epsilon(event_for(sigma), delta=d, relation=ADD_REMOVE)
    assert 0.99 * target <= achieved <= target
