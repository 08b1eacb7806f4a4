"""The accountant interface and what every accountant shares.

An accountant turns a declared :class:`~dpppl.privacy.events.PrivacyEvent` into an (ε, δ) guarantee and,
the other way round, finds the noise multiplier for a target.  Accountants are plugins: this module
holds only the interface they implement and what every accountant shares.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from dpppl.privacy.events import NeighbourRelation, PrivacyEvent
from dpppl.privacy.noise_calibration import calibrate_noise_multiplier


class Accountant(ABC):
    """Interface of a privacy accountant plugin.

    Subclasses set :attr:`name` (the string users pass as ``accountant=``) and implement
    :meth:`check`, :meth:`epsilon` and :meth:`delta`.  :meth:`noise_multiplier` has a generic
    implementation (:func:`dpppl.privacy.noise_calibration.calibrate_noise_multiplier`, safeguarded secant
    steps on log ε), which a plugin may replace by a faster one as long as it keeps the contract:
    the returned σ satisfies ``epsilon(σ) <= target`` and lies within
    :data:`~dpppl.privacy.noise_calibration.CALIBRATION_RTOL` of it.
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
