"""Noise calibration by safeguarded secant steps on log ε against log σ.

ε of a Gaussian mechanism falls roughly like a power of σ, so log ε is close to linear in log σ and
secant steps in those coordinates land in the 1 % band around the target within a few accountant
calls, where bisection needs ten or more.  That matters for accountants whose every call costs
seconds (PRV) and keeps the cheap ones (RDP, PLD) well inside their time budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dpppl.errors import InvalidPrivacyParameterError, PluginError

#: Calibration stops once ε(σ) lies in [(1 - CALIBRATION_RTOL) · target, target].
CALIBRATION_RTOL = 0.01
#: Above this noise multiplier a target is declared unreachable.
MAX_NOISE_MULTIPLIER = 1e6

#: Largest factor by which one step may change σ before ε has been seen on both sides of the target.
MAX_STEP_FACTOR = 1e3
#: Slope of log ε against log σ assumed until two points give a measured one (ε ∝ 1/σ).
DEFAULT_SLOPE = -1.0
#: Accountant calls after which the search stops and returns its best safe point.
MAX_EVALUATIONS = 100
#: Relative width of the bracket on σ below which the search stops (ε jumps across the band).
SIGMA_RTOL = 1e-9


def calibrate_noise_multiplier(
    epsilon_of: Callable[[float], float],
    target: float,
    *,
    initial: float = 1.0,
    rtol: float = CALIBRATION_RTOL,
    max_noise_multiplier: float = MAX_NOISE_MULTIPLIER,
) -> float:
    """A noise multiplier σ with ``target·(1 - rtol) <= epsilon_of(σ) <= target``.

    Parameters
    ----------
    epsilon_of
        Upper bound on ε as a function of σ; must not increase with σ.
    target
        The ε not to exceed.
    initial
        Where the search starts; a guess near the answer saves calls.
    rtol
        Relative width of the accepted band below ``target``.
    max_noise_multiplier
        Above this σ the target is declared unreachable.

    Returns
    -------
    float
        A σ at which ``epsilon_of`` was evaluated and found at most ``target``.  If ε jumps across
        the band, or the band is not reached within :data:`MAX_EVALUATIONS` calls, the smallest
        evaluated σ whose ε is at most ``target`` is returned, so the answer never overshoots.

    Raises
    ------
    InvalidPrivacyParameterError
        If no σ up to ``max_noise_multiplier`` brings ε down to ``target``.
    PluginError
        If ``epsilon_of`` returns NaN or a negative number.
    """
    if not (math.isfinite(initial) and initial > 0):
        raise ValueError(f"initial must be positive and finite, got {initial!r}")
    if not 0 < rtol < 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol}")
    floor = target * (1 - rtol)
    # Aim at the middle of the band (in log ε) so that a slightly wrong step still lands inside it.
    aim = math.log(target) + 0.5 * math.log1p(-rtol)
    # Points are (log σ, log ε - aim).  `too_little` is the largest σ seen with ε above the target,
    # `too_much` the smallest σ seen with ε below the band: together they bracket the answer.
    too_little: float | None = None
    too_much: float | None = None
    history: list[tuple[float, float]] = []
    widths: list[float] = []  # bracket width after each evaluation, once there is a bracket
    log_max = math.log(max_noise_multiplier)
    x = math.log(initial)
    for _ in range(MAX_EVALUATIONS):
        # A step past the limit tries the limit itself; ε above the target there is unreachable.
        x = min(x, log_max)
        sigma = math.exp(x)
        eps = epsilon_of(sigma)
        # NaN fails every comparison below and would pass for "below the band": refuse it here.
        # +inf is a valid upper bound (no guarantee at this σ) and counts as above the target.
        if math.isnan(eps) or eps < 0:
            raise PluginError(
                f"the accountant returned epsilon={eps!r} at noise multiplier {sigma:.6g}; an "
                "accountant must return a finite upper bound on epsilon, so nothing was "
                "calibrated. Try another accountant (accountant=...) and report this one"
            )
        if floor <= eps <= target:
            return sigma
        if eps > target:
            if x >= log_max:
                raise _unreachable(target, max_noise_multiplier)
            too_little = x if too_little is None else max(too_little, x)
        else:
            too_much = x if too_much is None else min(too_much, x)
        history.append((x, _log_gap(eps, aim)))
        if too_little is None or too_much is None:
            x = _extrapolate(history)
        else:
            widths.append(too_much - too_little)
            if widths[-1] < SIGMA_RTOL:
                break
            # Secant steps that stop halving the bracket (a badly curved ε) give way to bisection.
            stalled = len(widths) >= 3 and widths[-1] > 0.5 * widths[-3]
            if stalled:
                x = 0.5 * (too_little + too_much)
            else:
                x = _secant(history, too_little, too_much)
    if too_much is None:
        raise InvalidPrivacyParameterError(
            f"calibration found no noise multiplier with epsilon <= {target:g} in "
            f"{MAX_EVALUATIONS} accountant calls"
        )
    return math.exp(too_much)


def _unreachable(target: float, max_noise_multiplier: float) -> InvalidPrivacyParameterError:
    return InvalidPrivacyParameterError(
        f"no noise multiplier up to {max_noise_multiplier:g} reaches epsilon={target:g}: "
        "the target is too small for this many steps and this sampling rate; "
        "raise epsilon, lower the number of steps or the sampling rate"
    )


def _log_gap(eps: float, aim: float) -> float:
    if eps <= 0:
        return -math.inf
    return math.log(eps) - aim


def _slope(history: list[tuple[float, float]]) -> float:
    """Slope through the last two points, or the default when it is not usable."""
    if len(history) >= 2:
        (x0, y0), (x1, y1) = history[-2], history[-1]
        if x0 != x1 and math.isfinite(y0) and math.isfinite(y1):
            slope = (y1 - y0) / (x1 - x0)
            if slope < 0:
                return slope
    return DEFAULT_SLOPE


def _extrapolate(history: list[tuple[float, float]]) -> float:
    """Next log σ while the target is on one side of every point seen so far."""
    x, y = history[-1]
    max_step = math.log(MAX_STEP_FACTOR)
    if not math.isfinite(y):
        return x + max_step if y > 0 else x - max_step
    step = -y / _slope(history)
    return x + max(-max_step, min(max_step, step))


def _secant(history: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Next log σ inside the bracket (lo, hi): the secant point, or the midpoint if it is outside.

    The secant goes through the two most recent points, which converge on the root, rather than
    through the bracket's ends, one of which may stay put for many steps (regula falsi's weakness).
    """
    x, y = history[-1]
    if math.isfinite(y):
        candidate = x - y / _slope(history)
        if lo < candidate < hi:
            # Stay off the ends so that every step shrinks the bracket by a useful amount.
            margin = 0.05 * (hi - lo)
            return min(max(candidate, lo + margin), hi - margin)
    return 0.5 * (lo + hi)
