"""The core's noise calibration, driven by the installed accountant plugins."""

from __future__ import annotations

import pytest

from dpppl.errors import InvalidPrivacyParameterError
from dpppl.plugin.registry import get_accountant
from dpppl.privacy.events import (
    ComposedEvent,
    GaussianEvent,
    NeighbourRelation,
    SelfComposedEvent,
    poisson_subsampled_gaussian,
)
from dpppl.privacy.noise_calibration import calibrate_noise_multiplier

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE
DELTA = 1e-5


def dp_sgd(sigma: float):
    return poisson_subsampled_gaussian(sigma, 0.05, 100)


def rdp_epsilon_of(sigma: float) -> float:
    return get_accountant("rdp")().epsilon(dp_sgd(sigma), delta=DELTA, relation=ADD_REMOVE)


# calibrate_noise_multiplier ------------------------------------------------------------------


@pytest.mark.parametrize("initial", [0.5, 50.0])
def test_calibration_lands_in_the_band_below_the_target_from_any_side(initial):
    sigma = calibrate_noise_multiplier(rdp_epsilon_of, 1.0, initial=initial)
    assert 0.99 <= rdp_epsilon_of(sigma) <= 1.0


def test_calibration_with_a_wide_tolerance_still_never_overshoots():
    sigma = calibrate_noise_multiplier(rdp_epsilon_of, 0.5, initial=1.0, rtol=0.5)
    assert 0.25 <= rdp_epsilon_of(sigma) <= 0.5


def test_calibration_refuses_a_target_no_noise_reaches():
    # ε of a fixed part of the event does not fall with σ: 8 unperturbed-σ steps at σ = 0.5.
    fixed = SelfComposedEvent(GaussianEvent(0.5), 8)
    pld = get_accountant("pld")()

    def epsilon_of(sigma: float) -> float:
        event = ComposedEvent((fixed, GaussianEvent(sigma)))
        return pld.epsilon(event, delta=DELTA, relation=ADD_REMOVE)

    with pytest.raises(InvalidPrivacyParameterError, match="no noise multiplier"):
        calibrate_noise_multiplier(epsilon_of, 1.0, initial=1.0, max_noise_multiplier=1e3)


def test_calibration_refuses_a_tolerance_outside_the_unit_interval():
    with pytest.raises(ValueError, match="rtol"):
        calibrate_noise_multiplier(rdp_epsilon_of, 1.0, rtol=1.0)
