"""The ``rdp`` accountant: published values, its order grid, calibration, and its refusals."""

from __future__ import annotations

import pytest

from dpppl.plugin import (
    GaussianEvent,
    InvalidPrivacyParameterError,
    NeighbourRelation,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    UnsupportedEventError,
    poisson_subsampled_gaussian,
)
from dpppl_dp_accounting.rdp import ORDERS, RdpAccountant

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE
REPLACE = NeighbourRelation.REPLACE_ONE


@pytest.fixture(scope="module")
def rdp() -> RdpAccountant:
    return RdpAccountant()


def test_opacus_dp_sgd_value(rdp):
    # Opacus accountants_test.py: σ = 1.5, q = 0.04, 90 epochs = 2250 steps, δ = 1e-5.
    event = poisson_subsampled_gaussian(1.5, 0.04, 2250)
    epsilon = rdp.epsilon(event, delta=1e-5, relation=ADD_REMOVE)
    assert epsilon == pytest.approx(7.32911117143, rel=1e-4)


def test_tensorflow_privacy_mnist_value(rdp):
    # TF Privacy compute_dp_sgd_privacy_test.py: optimum at order 19, which our grid contains.
    event = poisson_subsampled_gaussian(1.3, 150 / 60000, 6000)
    assert rdp.epsilon(event, delta=1e-5, relation=ADD_REMOVE) == pytest.approx(
        0.7242234026109595, rel=1e-9
    )


def test_gaussian_calibrated_to_exactly_one_epsilon(rdp):
    # dp_accounting's own test: σ = 4.530877117 is exactly (1, 1e-6)-RDP-DP on a dense order grid;
    # a coarser grid may only be more conservative.
    event = GaussianEvent(4.530877117)
    epsilon = rdp.epsilon(event, delta=1e-6, relation=ADD_REMOVE)
    assert 1 <= epsilon <= 1 + 1e-5
    delta = rdp.delta(event, epsilon=1.0, relation=ADD_REMOVE)
    assert 1e-6 <= delta <= 1e-6 * (1 + 1e-4)


def test_orders_reach_1024_without_a_gap_wider_than_a_fifth():
    large = [order for order in ORDERS if order >= 63]
    assert max(ORDERS) == 1024
    assert all(b / a <= 1.2 for a, b in zip(large, large[1:]))


@pytest.mark.parametrize("target", [1.0, 0.3, 0.1])
def test_calibration_at_the_papers_settings_lands_in_the_band(rdp, target):
    def event_for(sigma):
        return poisson_subsampled_gaussian(sigma, 0.1, 10_000)

    sigma = rdp.noise_multiplier(event_for, epsilon=target, delta=1e-5, relation=ADD_REMOVE)
    assert 0.99 * target <= rdp.epsilon(event_for(sigma), delta=1e-5, relation=ADD_REMOVE) <= target


def test_a_target_of_a_few_thousandths_is_reached_with_the_large_orders(rdp):
    def event_for(sigma):
        return poisson_subsampled_gaussian(sigma, 0.1, 100)

    sigma = rdp.noise_multiplier(event_for, epsilon=0.005, delta=1e-5, relation=ADD_REMOVE)
    assert 0.00495 <= rdp.epsilon(event_for(sigma), delta=1e-5, relation=ADD_REMOVE) <= 0.005


def test_sampling_without_replacement_is_accounted_under_replace_one_only(rdp):
    event = SelfComposedEvent(SampledWithoutReplacementEvent(10_000, 100, GaussianEvent(2.0)), 500)
    every_time_everyone = SelfComposedEvent(GaussianEvent(2.0), 500)
    epsilon = rdp.epsilon(event, delta=1e-5, relation=REPLACE)
    assert 0 < epsilon < rdp.epsilon(every_time_everyone, delta=1e-5, relation=REPLACE)
    with pytest.raises(UnsupportedEventError, match="REPLACE_ONE"):
        rdp.check(event, ADD_REMOVE)


def test_a_plain_gaussian_reads_the_same_under_both_relations(rdp):
    # dpppl's noise multipliers are relative to the sensitivity under the declared relation.
    event = SelfComposedEvent(GaussianEvent(3.0), 10)
    assert rdp.epsilon(event, delta=1e-5, relation=REPLACE) == rdp.epsilon(
        event, delta=1e-5, relation=ADD_REMOVE
    )


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, float("nan")])
def test_delta_outside_the_unit_interval_is_refused(rdp, delta):
    with pytest.raises(InvalidPrivacyParameterError):
        rdp.epsilon(GaussianEvent(1.0), delta=delta, relation=ADD_REMOVE)
