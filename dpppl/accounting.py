"""The accountant interface and what every accountant shares.

An accountant turns a declared :class:`~dpppl.events.PrivacyEvent` into an (ε, δ) guarantee and,
the other way round, finds the noise multiplier for a target.  Accountants are plugins: this module
holds only the interface they implement and what every accountant shares.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from dpppl.calibration import calibrate_noise_multiplier
from dpppl.errors import InvalidPrivacyParameterError
from dpppl.events import NeighbourRelation, PrivacyEvent


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


def total_variation_delta(epsilon: float, variation: float) -> float:
    """The δ that a total-variation distance costs at ε.

    A mechanism within total variation η of an (ε, δ')-DP one is (ε, δ' + (1 + e^ε)·η)-DP: batches
    truncated to a fixed shape, or discrete noise standing in for continuous noise, are charged
    this way.
    """
    return (1 + math.exp(epsilon)) * variation


class Accountant(ABC):
    """Interface of a privacy accountant plugin.

    Subclasses set :attr:`name` (the string users pass as ``accountant=``) and implement
    :meth:`check`, :meth:`epsilon` and :meth:`delta`.  :meth:`noise_multiplier` has a generic
    implementation (:func:`dpppl.calibration.calibrate_noise_multiplier`, safeguarded secant
    steps on log ε), which a plugin may replace by a faster one as long as it keeps the contract:
    the returned σ satisfies ``epsilon(σ) <= target`` and lies within
    :data:`~dpppl.calibration.CALIBRATION_RTOL` of it.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""

    @abstractmethod
    def check(self, event: PrivacyEvent, relation: NeighbourRelation) -> None:
        """Raise :class:`~dpppl.errors.UnsupportedEventError` with a reason if this accountant cannot
        account ``event`` under ``relation``; return None otherwise."""

    @abstractmethod
    def epsilon(self, event: PrivacyEvent, *, delta: float, relation: NeighbourRelation) -> float:
        """An upper bound on ε at ``delta`` for ``event`` (never an estimate below the truth)."""

    @abstractmethod
    def delta(self, event: PrivacyEvent, *, epsilon: float, relation: NeighbourRelation) -> float:
        """An upper bound on δ at ``epsilon`` for ``event``."""

    def noise_multiplier(
        self,
        event_for: Callable[[float], PrivacyEvent],
        *,
        epsilon: float,
        delta: float,
        relation: NeighbourRelation,
        initial: float = 1.0,
    ) -> float:
        """The noise multiplier σ for which ``event_for(σ)`` is (ε, δ)-DP, ε within 1 % below target.

        Parameters
        ----------
        event_for
            Builds the mechanism's event for a noise multiplier.
        epsilon, delta
            The target guarantee.
        relation
            The neighbour relation of the guarantee.
        initial
            A first guess for σ; a good one saves accountant calls.
        """
        self.check(event_for(initial), relation)
        return calibrate_noise_multiplier(
            lambda sigma: self.epsilon(event_for(sigma), delta=delta, relation=relation),
            epsilon,
            initial=initial,
        )
