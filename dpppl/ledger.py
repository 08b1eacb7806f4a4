"""The privacy ledger: one budget for a data set, charged by every fit that touches it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpppl.accounting import Accountant, check_epsilon_delta
from dpppl.errors import (
    InvalidPrivacyParameterError,
    PrivacyBudgetExceededError,
    UnsupportedEventError,
)
from dpppl.events import ComposedEvent, NeighbourRelation, PrivacyEvent, event_from_dict


@dataclass(frozen=True)
class LedgerEntry:
    """One charge on a ledger: what ran, under which relation, and what it claimed on its own.

    ``extra_delta`` is the part of ``delta`` the fit spent outside ``event`` (see
    :attr:`dpppl.mechanism.PrivacyPlan.extra_delta`).
    """

    event: PrivacyEvent
    relation: NeighbourRelation
    label: str
    epsilon: float
    delta: float
    extra_delta: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.event.to_dict(),
            "relation": self.relation.value,
            "label": self.label,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "extra_delta": self.extra_delta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LedgerEntry:
        return cls(
            event=event_from_dict(data["event"]),
            relation=NeighbourRelation(data["relation"]),
            label=data["label"],
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            extra_delta=float(data.get("extra_delta", 0.0)),
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

    def _extra_delta(self, epsilon: float, extra_delta: float) -> float:
        """A fit's ``extra_delta``, reported at its own ``epsilon``, at the budget's ε.

        It is a total-variation term (1 + e^ε)·η, which grows with ε; it is never taken below
        what the fit reported.
        """
        if extra_delta == 0:
            return 0.0
        growth = _log1p_exp(self.epsilon) - _log1p_exp(epsilon)
        return extra_delta * math.exp(max(growth, 0.0))

    def _epsilon_of(self, events: list[PrivacyEvent], extra_delta: float) -> float:
        """ε of ``events`` composed at the ledger's δ less the δ the fits spent outside them."""
        if not events:
            return 0.0
        if extra_delta >= self.delta:
            raise PrivacyBudgetExceededError(
                f"the fits spend delta={extra_delta:.4g} outside their declared events, which uses "
                f"up the ledger's delta={self.delta:g}; nothing was run"
            )
        return self._accountant().epsilon(
            ComposedEvent(tuple(events)), delta=self.delta - extra_delta, relation=self.relation
        )

    def _composed(self, entries: list[LedgerEntry]) -> tuple[list[PrivacyEvent], float]:
        events = [e.event for e in entries]
        return events, sum(self._extra_delta(e.epsilon, e.extra_delta) for e in entries)

    def spent(self) -> float:
        """ε of all charges so far at the ledger's δ.

        The accountant composes their events at the ledger's δ less the δ the fits spent outside
        their events (:attr:`LedgerEntry.extra_delta`).
        """
        return self._epsilon_of(*self._composed(self.entries))

    def check(
        self,
        event: PrivacyEvent | None,
        relation: NeighbourRelation,
        *,
        epsilon: float = 0.0,
        extra_delta: float = 0.0,
    ) -> float:
        """ε the ledger would have spent after charging ``event``; raise if over budget.

        Parameters
        ----------
        event, relation
            The fit's declared event and neighbour relation.
        epsilon, extra_delta
            The fit's own ε, and the part of its δ spent outside ``event``
            (:attr:`dpppl.mechanism.PrivacyPlan.extra_delta`), which the ledger rescales from
            ``epsilon`` to its budget's ε (0 rescales it the most).

        Raises
        ------
        PrivacyBudgetExceededError
            If the composition would exceed the budget, or the event cannot be composed here.
        """
        return self._spent_after(self.entries, event, relation, epsilon, extra_delta)

    def _spent_after(
        self,
        entries: list[LedgerEntry],
        event: PrivacyEvent | None,
        relation: NeighbourRelation,
        epsilon: float,
        extra_delta: float,
    ) -> float:
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
        events, extra = self._composed(entries)
        try:
            after = self._epsilon_of(
                [*events, event], extra + self._extra_delta(epsilon, extra_delta)
            )
        except UnsupportedEventError as error:
            raise PrivacyBudgetExceededError(
                f"the ledger's accountant {self.accountant!r} cannot compose this fit: {error}"
            ) from error
        if after > self.epsilon:
            raise PrivacyBudgetExceededError(
                f"this fit would bring the ledger to epsilon={after:.4g} at delta={self.delta:g}, "
                f"over its budget of epsilon={self.epsilon:g} (spent so far: "
                f"{self._epsilon_of(events, extra):.4g}); nothing was run. Ask for a smaller "
                "epsilon or use a new data set"
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
        extra_delta: float = 0.0,
    ) -> float:
        """Check ``event`` against the budget, record it, and return ε spent after it.

        ``epsilon``, ``delta`` and ``extra_delta`` are the fit's own guarantee and the part of its
        δ spent outside ``event`` (see :meth:`check`).
        """
        after = self._spent_after(self.entries, event, relation, epsilon, extra_delta)
        self.entries.append(
            LedgerEntry(event, NeighbourRelation(relation), label, epsilon, delta, extra_delta)
        )
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


def _log1p_exp(x: float) -> float:
    """log(1 + e^x) without overflow."""
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))
