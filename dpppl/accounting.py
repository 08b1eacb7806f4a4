"""The accountant interface, noise calibration and the privacy ledger.

An accountant turns a declared :class:`~dpppl.events.PrivacyEvent` into an (ε, δ) guarantee and,
the other way round, finds the noise multiplier for a target.  Accountants are plugins: this module
holds only the interface they implement and what every accountant shares.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dpppl.calibration import calibrate_noise_multiplier
from dpppl.errors import (
    InvalidPrivacyParameterError,
    PrivacyBudgetExceededError,
    UnsupportedEventError,
)
from dpppl.events import ComposedEvent, NeighbourRelation, PrivacyEvent, event_from_dict


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


@dataclass(frozen=True)
class LedgerEntry:
    """One charge on a ledger: what ran, under which relation, and what it claimed on its own."""

    event: PrivacyEvent
    relation: NeighbourRelation
    label: str
    epsilon: float
    delta: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.event.to_dict(),
            "relation": self.relation.value,
            "label": self.label,
            "epsilon": self.epsilon,
            "delta": self.delta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LedgerEntry:
        return cls(
            event=event_from_dict(data["event"]),
            relation=NeighbourRelation(data["relation"]),
            label=data["label"],
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
        )


@dataclass
class PrivacyLedger:
    """A privacy budget for one data set, charged by every fit that touches it.

    The guarantee of all fits together is computed by the ledger's accountant on the composition of
    their events, never by adding ε's.  A fit that would take the composition past ``epsilon`` (at
    the ledger's ``delta``) is refused before it runs.

    Parameters
    ----------
    epsilon, delta
        The total budget.
    accountant
        Name of the accountant plugin that composes the charges.
    relation
        The neighbour relation of the budget; every charge must be declared under it.
    path
        Optional JSON file.  When given, the ledger is loaded from it if it exists and written back
        after every charge, so a budget survives between sessions.

    Examples
    --------
    >>> ledger = dpppl.PrivacyLedger(epsilon=2.0, delta=1e-5, path="adult-budget.json")
    >>> with model:
    ...     idata = dpppl.sample(mechanism="na-dpvi", epsilon=1.0, delta=1e-6, ledger=ledger)
    >>> ledger.spent()
    """

    epsilon: float
    delta: float
    accountant: str = "pld"
    relation: NeighbourRelation = NeighbourRelation.ADD_OR_REMOVE_ONE
    path: str | Path | None = None
    entries: list[LedgerEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.epsilon, self.delta = check_epsilon_delta(self.epsilon, self.delta)
        self.relation = NeighbourRelation(self.relation)
        if self.path is not None and Path(self.path).exists():
            stored = json.loads(Path(self.path).read_text())
            if (stored["epsilon"], stored["delta"], stored["relation"]) != (
                self.epsilon,
                self.delta,
                self.relation.value,
            ):
                raise InvalidPrivacyParameterError(
                    f"the ledger stored in {self.path} has budget epsilon={stored['epsilon']}, "
                    f"delta={stored['delta']} under {stored['relation']}; open it with those values"
                )
            self.entries = [LedgerEntry.from_dict(e) for e in stored["entries"]]

    def _accountant(self) -> Accountant:
        from dpppl.plugins import get_accountant

        return get_accountant(self.accountant)()

    def _epsilon_of(self, events: list[PrivacyEvent]) -> float:
        if not events:
            return 0.0
        return self._accountant().epsilon(
            ComposedEvent(tuple(events)), delta=self.delta, relation=self.relation
        )

    def spent(self) -> float:
        """ε of all charges so far, composed by the accountant at the ledger's δ."""
        return self._epsilon_of([e.event for e in self.entries])

    def check(self, event: PrivacyEvent | None, relation: NeighbourRelation) -> float:
        """ε the ledger would have spent after charging ``event``; raise if over budget.

        Raises
        ------
        PrivacyBudgetExceededError
            If the composition would exceed the budget, or the event cannot be composed here.
        """
        if event is None:
            raise PrivacyBudgetExceededError(
                "this mechanism declares no accountable privacy event (its guarantee is of another "
                "kind), so a ledger cannot compose it; run it without a ledger"
            )
        if NeighbourRelation(relation) != self.relation:
            raise PrivacyBudgetExceededError(
                f"the ledger is kept under {self.relation.value} but this fit is private under "
                f"{NeighbourRelation(relation).value}; use a ledger with relation={relation!r}"
            )
        try:
            after = self._epsilon_of([e.event for e in self.entries] + [event])
        except UnsupportedEventError as error:
            raise PrivacyBudgetExceededError(
                f"the ledger's accountant {self.accountant!r} cannot compose this fit: {error}"
            ) from error
        if after > self.epsilon:
            raise PrivacyBudgetExceededError(
                f"this fit would bring the ledger to epsilon={after:.4g} at delta={self.delta:g}, over "
                f"its budget of epsilon={self.epsilon:g} (spent so far: {self.spent():.4g}); "
                "nothing was run. Ask for a smaller epsilon or use a new data set"
            )
        return after

    def charge(
        self,
        event: PrivacyEvent | None,
        relation: NeighbourRelation,
        *,
        label: str,
        epsilon: float,
        delta: float,
    ) -> float:
        """Check ``event`` against the budget, record it, and return ε spent after it."""
        after = self.check(event, relation)
        self.entries.append(LedgerEntry(event, NeighbourRelation(relation), label, epsilon, delta))
        if self.path is not None:
            self.save(self.path)
        return after

    def save(self, path: str | Path) -> None:
        """Write the ledger as JSON (it holds only public metadata: events and settings)."""
        Path(path).write_text(
            json.dumps(
                {
                    "epsilon": self.epsilon,
                    "delta": self.delta,
                    "relation": self.relation.value,
                    "accountant": self.accountant,
                    "entries": [e.to_dict() for e in self.entries],
                },
                indent=2,
            )
        )
