"""What the accountants built on dp_accounting share: validation, translation, refusals."""

from __future__ import annotations

import math
from abc import abstractmethod

import dp_accounting as dpa

from dpppl.plugin import (
    Accountant,
    InvalidPrivacyParameterError,
    NeighbourRelation,
    PrivacyEvent,
    UnsupportedEventError,
)
from dpppl_dp_accounting.translation import to_dp_event


def check_delta(delta: float) -> float:
    """``delta`` as a float; raise :class:`InvalidPrivacyParameterError` unless it is in (0, 1)."""
    delta = float(delta)
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise InvalidPrivacyParameterError(
            f"delta must lie strictly between 0 and 1, got {delta!r}"
        )
    return delta


def check_epsilon(epsilon: float) -> float:
    """``epsilon`` as a float; raise :class:`InvalidPrivacyParameterError` unless finite and ≥ 0."""
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise InvalidPrivacyParameterError(
            f"epsilon must be a non-negative finite number, got {epsilon!r}"
        )
    return epsilon


class DpAccountingAccountant(Accountant):
    """Base of the accountants on dp_accounting.

    Subclasses say which dp_accounting accountant to build (:meth:`library`) and may rescale noise
    multipliers per relation (:meth:`noise_multiplier_scale`); this class translates events, turns
    the library's refusals and errors into :class:`~dpppl.errors.UnsupportedEventError`, and
    composes.
    """

    @abstractmethod
    def library(self, relation: NeighbourRelation, **settings: float) -> dpa.PrivacyAccountant:
        """A fresh dp_accounting accountant for ``relation``."""

    def noise_multiplier_scale(self, relation: NeighbourRelation) -> float:
        """Factor from dpppl's noise multipliers to the library's under ``relation``."""
        return 1.0

    def dp_event(self, event: PrivacyEvent, relation: NeighbourRelation) -> dpa.DpEvent:
        """``event`` in dp_accounting's vocabulary, as this accountant's library reads it."""
        return to_dp_event(
            event, relation, noise_multiplier_scale=self.noise_multiplier_scale(relation)
        )

    def check(self, event: PrivacyEvent, relation: NeighbourRelation) -> None:
        self._supported(event, NeighbourRelation(relation), self.library(relation))

    def composed(
        self, event: PrivacyEvent, relation: NeighbourRelation, **settings: float
    ) -> dpa.PrivacyAccountant:
        """A library accountant that has composed ``event`` under ``relation``.

        Raises
        ------
        UnsupportedEventError
            If the library cannot account the event, or fails on its parameters.
        """
        relation = NeighbourRelation(relation)
        library = self.library(relation, **settings)
        dp_event = self._supported(event, relation, library)
        try:
            return library.compose(dp_event)
        except (ValueError, ArithmeticError) as error:
            raise UnsupportedEventError(
                f"accountant {self.name!r} failed on this event: {error}"
            ) from error

    def _supported(
        self, event: PrivacyEvent, relation: NeighbourRelation, library: dpa.PrivacyAccountant
    ) -> dpa.DpEvent:
        dp_event = self.dp_event(event, relation)
        if not library.supports(dp_event):
            # compose() checks support before it computes anything, and its message says which
            # part of the event the library refuses and why.
            try:
                library.compose(dp_event)
            except dpa.UnsupportedEventError as error:
                raise UnsupportedEventError(
                    f"accountant {self.name!r} cannot account this event under "
                    f"{relation.value}: {error}"
                ) from None
        return dp_event
