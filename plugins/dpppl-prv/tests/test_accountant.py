"""The ``prv`` accountant: its error budget, calibration, cache, δ, and refusals."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

import dpppl
from dpppl.plugin import (
    ComposedEvent,
    GaussianEvent,
    InvalidPrivacyParameterError,
    NeighbourRelation,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    UnsupportedEventError,
    get_accountant,
    poisson_subsampled_gaussian,
)
from dpppl_dp_accounting.rdp import RdpAccountant
from dpppl_prv import accountant as module
from dpppl_prv.accountant import EPS_ERROR_FRACTION, PrvAccountant, eps_error, upper_epsilon
from dpppl_prv.bounds import epsilon_bounds
from dpppl_prv.composition import composition_of

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE
REPLACE = NeighbourRelation.REPLACE_ONE


@pytest.fixture(scope="module")
def prv() -> PrvAccountant:
    return PrvAccountant()


def test_the_accountant_is_found_by_name_through_the_entry_point():
    assert get_accountant("prv") is PrvAccountant
    assert dpppl.accountants()["prv"].distribution == "dpppl-prv"


def test_epsilon_is_prv_accountants_upper_bound_with_one_percent_of_rdp_as_error(prv):
    event = poisson_subsampled_gaussian(1.5, 0.04, 2250)
    composition = composition_of(event, ADD_REMOVE)
    error = eps_error(composition, 1e-5)
    rdp = RdpAccountant().epsilon(event, delta=1e-5, relation=ADD_REMOVE)
    assert error == pytest.approx(EPS_ERROR_FRACTION * rdp)
    lo, estimate, up = epsilon_bounds(composition, delta=1e-5, eps_error=error, delta_error=1e-8)
    assert prv.epsilon(event, delta=1e-5, relation=ADD_REMOVE) == up
    assert estimate + error <= up <= estimate + error * 1.01


def test_calibration_at_the_papers_setting_lands_in_the_band_and_is_cached(prv):
    def event_for(sigma):
        return poisson_subsampled_gaussian(sigma, 0.1, 10_000)

    sigma = prv.noise_multiplier(event_for, epsilon=1.0, delta=1e-5, relation=ADD_REMOVE)
    hits = upper_epsilon.cache_info().hits
    achieved = prv.epsilon(event_for(sigma), delta=1e-5, relation=ADD_REMOVE)
    assert 0.99 <= achieved <= 1.0
    # The mechanism's plan asks for ε at the calibrated σ again: that costs nothing.
    assert upper_epsilon.cache_info().hits == hits + 1


def test_calibration_confirms_the_coarse_prediction_with_the_fine_bound(prv, monkeypatch):
    # Even if the coarse grid mispredicted badly, the answer is checked on the fine bound.
    monkeypatch.setattr(module, "COARSE_FACTOR", 1)
    monkeypatch.setattr(module, "PREDICTED_TARGET", 0.9)

    def event_for(sigma):
        return poisson_subsampled_gaussian(sigma, 0.05, 200)

    sigma = prv.noise_multiplier(event_for, epsilon=1.0, delta=1e-5, relation=ADD_REMOVE)
    assert 0.99 <= prv.epsilon(event_for(sigma), delta=1e-5, relation=ADD_REMOVE) <= 1.0


def test_several_fits_on_the_same_data_are_composed_not_added(prv):
    fit = poisson_subsampled_gaussian(2.0, 0.05, 200)
    one = prv.epsilon(fit, delta=1e-5, relation=ADD_REMOVE)
    both = prv.epsilon(ComposedEvent((fit, fit)), delta=1e-5, relation=ADD_REMOVE)
    assert one < both < 2 * one


def test_delta_is_an_upper_bound_off_by_no_more_than_its_epsilon_error(prv):
    # A Gaussian with μ = √100/10 = 1 has δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2); the bound is
    # the estimate at ε minus 1 % of ε, plus δ error 1e-10.
    def exact(epsilon):
        return norm.cdf(-epsilon + 0.5) - math.exp(epsilon) * norm.cdf(-epsilon - 0.5)

    delta = prv.delta(SelfComposedEvent(GaussianEvent(10.0), 100), epsilon=3.0, relation=REPLACE)
    assert exact(3.0) <= delta <= (exact(3.0 * 0.99) + 1e-10) * (1 + 1e-4)


def test_sampling_without_replacement_is_refused_naming_rdp(prv):
    event = SampledWithoutReplacementEvent(1000, 10, GaussianEvent(1.0))
    with pytest.raises(UnsupportedEventError, match="rdp"):
        prv.check(event, REPLACE)


def test_poisson_subsampling_under_replace_one_is_refused_before_calibrating(prv):
    with pytest.raises(UnsupportedEventError, match="add_or_remove_one"):
        prv.noise_multiplier(
            lambda sigma: poisson_subsampled_gaussian(sigma, 0.1, 100),
            epsilon=1.0,
            delta=1e-5,
            relation=REPLACE,
        )


@pytest.mark.parametrize(("epsilon", "delta"), [(0.0, 1e-5), (1.0, 0.0), (1.0, 1.5)])
def test_targets_outside_their_ranges_are_refused(prv, epsilon, delta):
    with pytest.raises(InvalidPrivacyParameterError):
        prv.noise_multiplier(GaussianEvent, epsilon=epsilon, delta=delta, relation=ADD_REMOVE)
