"""The (ε, δ) vocabulary every layer checks against: a target's validity and what a
total-variation distance costs in δ."""

from __future__ import annotations

import math
import sys

from dpppl.errors import InvalidPrivacyParameterError


def check_epsilon_delta(epsilon: float, delta: float) -> tuple[float, float]:
    """Validate a target (ε, δ) and return it as floats.

    Raises
    ------
    InvalidPrivacyParameterError
        If ε is not a positive finite number or δ is not in the open interval (0, 1).
    """
    try:
        epsilon = float(epsilon)
    except (TypeError, ValueError):
        raise InvalidPrivacyParameterError(
            f"epsilon must be a number, got {type(epsilon).__name__}"
        ) from None
    try:
        delta = float(delta)
    except (TypeError, ValueError):
        raise InvalidPrivacyParameterError(
            f"delta must be a number, got {type(delta).__name__}"
        ) from None
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise InvalidPrivacyParameterError(
            f"epsilon must be a positive finite number, got {epsilon!r}: "
            "choose the privacy loss you accept, for example epsilon=1.0"
        )
    if not math.isfinite(delta) or not 0 < delta < 1:
        raise InvalidPrivacyParameterError(
            f"delta must lie strictly between 0 and 1, got {delta!r}: "
            "use a value well below 1/N, for example delta=1e-5"
        )
    return epsilon, delta


#: log of the largest float: e^x overflows above it.
LOG_FLOAT_MAX = math.log(sys.float_info.max)


def total_variation_delta(epsilon: float, variation: float) -> float:
    """The δ that a total-variation distance costs at ε.

    A mechanism within total variation η of an (ε, δ')-DP one is (ε, δ' + (1 + e^ε)·η)-DP: batches
    truncated to a fixed shape, or discrete noise standing in for continuous noise, are charged
    this way.  Where e^ε overflows a float (ε above about 709) a positive η costs an infinite δ,
    which no target covers.
    """
    if variation == 0:
        return 0.0
    log_cost = log_total_variation_delta(epsilon, variation)
    return math.exp(log_cost) if log_cost < LOG_FLOAT_MAX else math.inf


def log_total_variation_delta(epsilon: float, variation: float) -> float:
    """log of :func:`total_variation_delta` for η > 0, finite however large ε is."""
    return epsilon + math.log1p(math.exp(-epsilon)) + math.log(variation)
