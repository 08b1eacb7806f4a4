"""Calibration by secant steps: in the 1 % band below the target, never above, in few calls."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dpppl.errors import InvalidPrivacyParameterError, PluginError
from dpppl.privacy.noise_calibration import calibrate_noise_multiplier


class Counted:
    """ε(σ) = scale / σ^power, counting its calls."""

    def __init__(self, scale: float, power: float):
        self.scale, self.power, self.calls = scale, power, 0

    def __call__(self, sigma: float) -> float:
        self.calls += 1
        return self.scale / sigma**self.power


@settings(max_examples=60, deadline=None)
@given(
    scale=st.floats(1e-2, 1e3),
    power=st.floats(0.5, 3.0),
    target=st.floats(1e-2, 20.0),
    initial=st.floats(1e-2, 1e4),
)
def test_result_lies_in_the_band_below_the_target(scale, power, target, initial):
    assume((scale / target) ** (1 / power) < 1e5)  # reachable below the largest noise multiplier
    epsilon_of = Counted(scale, power)
    sigma = calibrate_noise_multiplier(epsilon_of, target, initial=initial)
    assert 0.99 * target <= epsilon_of(sigma) <= target


@pytest.mark.parametrize("power", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("off_by", [1e-3, 1e3])
def test_a_power_law_takes_a_handful_of_calls_from_a_guess_a_thousand_times_off(power, off_by):
    target, answer = 0.1, 300.0
    epsilon_of = Counted(scale=target * answer**power, power=power)
    calibrate_noise_multiplier(epsilon_of, target, initial=answer * off_by)
    assert epsilon_of.calls <= 8


def test_an_answer_just_below_the_largest_noise_multiplier_is_found():
    epsilon_of = Counted(scale=0.999e6, power=1.0)
    sigma = calibrate_noise_multiplier(epsilon_of, 1.0, initial=1.0, max_noise_multiplier=1e6)
    assert 0.99 <= epsilon_of(sigma) <= 1.0


def test_a_close_guess_is_accepted_at_once():
    epsilon_of = Counted(scale=10.0, power=1.0)
    assert calibrate_noise_multiplier(epsilon_of, 1.0, initial=10.05) == 10.05
    assert epsilon_of.calls == 1


def test_infinite_epsilon_at_small_noise_is_stepped_over():
    def epsilon_of(sigma: float) -> float:
        return math.inf if sigma < 5 else 50 / sigma

    sigma = calibrate_noise_multiplier(epsilon_of, 1.0, initial=0.1)
    assert 0.99 <= epsilon_of(sigma) <= 1.0


def test_a_staircase_that_skips_the_band_returns_the_best_point_below_the_target():
    # ε jumps from 1.2 to 0.5 at σ = 3: no σ reaches the band; the answer is the least noise that
    # does not overshoot.
    def epsilon_of(sigma: float) -> float:
        return 1.2 if sigma < 3 else 0.5

    sigma = calibrate_noise_multiplier(epsilon_of, 1.0, initial=1.0)
    assert epsilon_of(sigma) == 0.5
    assert sigma == pytest.approx(3.0, rel=1e-6)


def test_an_unreachable_target_is_refused_with_a_reason():
    with pytest.raises(InvalidPrivacyParameterError, match="too small"):
        calibrate_noise_multiplier(lambda sigma: 0.5 + 1 / sigma, 0.4, initial=1.0)


@pytest.mark.parametrize("initial", [0.0, -1.0, math.inf, math.nan])
def test_a_guess_that_is_not_a_positive_number_is_refused(initial):
    with pytest.raises(ValueError, match="initial"):
        calibrate_noise_multiplier(lambda sigma: 1 / sigma, 1.0, initial=initial)


@pytest.mark.parametrize("bad", [math.nan, -0.5])
def test_an_accountant_answer_that_is_not_an_upper_bound_is_refused(bad):
    """NaN fails every comparison and used to pass for "below the band": σ = 2 came back while the
    true ε there would be five times the target."""
    with pytest.raises(PluginError, match="finite upper bound"):
        calibrate_noise_multiplier(lambda sigma: bad if sigma > 2 else 1 / sigma, 0.1, initial=1.0)
