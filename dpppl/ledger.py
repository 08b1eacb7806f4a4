"""The privacy ledger: one budget for a data set, charged by every fit that touches it.

A ledger lives in memory (one Python session), in a SQLite file (``path=``: every process on
the machine that opens the file shares the budget) or in a PostgreSQL database (``url=``: a
budget shared by a team).  A charge reads every entry from the storage, composes them with the
new fit and records it in one transaction that holds the ledger's write lock, so processes that
charge at the same time queue and none of them can spend what another has just spent.

The ledger stores public metadata only: the budget, and for each fit its declared privacy event,
neighbour relation, label and guarantee.  Never data.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import urllib.parse
import uuid
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dpppl.errors import (
    InvalidPrivacyParameterError,
    PrivacyBudgetExceededError,
    UnsupportedEventError,
)
from dpppl.plugin.accountant import Accountant
from dpppl.plugin.registry import get_accountant
from dpppl.privacy.budget import check_epsilon_delta, total_variation_delta
from dpppl.privacy.events import (
    ComposedEvent,
    NeighbourRelation,
    PrivacyEvent,
    event_from_dict,
    event_from_json,
)


@dataclass(frozen=True)
class LedgerEntry:
    """One charge on a ledger: what ran, under which relation, and what it claimed on its own.

    ``extra_delta`` is the part of ``delta`` the fit spent outside ``event``, and
    ``max_divergence`` the factor e^(±γ) by which its output law may differ from one the event
    covers (see :class:`dpppl.plugin.mechanism.PrivacyPlan`).
    """

    event: PrivacyEvent
    relation: NeighbourRelation
    label: str
    epsilon: float
    delta: float
    extra_delta: float = 0.0
    max_divergence: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LedgerEntry:
        """An entry of a JSON ledger (the format before ledgers moved to databases)."""
        return cls(
            event=event_from_dict(data["event"]),
            relation=NeighbourRelation(data["relation"]),
            label=data["label"],
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            extra_delta=float(data.get("extra_delta", 0.0)),
            max_divergence=float(data.get("max_divergence", 0.0)),
        )


class PrivacyLedger:
    """A privacy budget for one data set, charged by every fit that touches it.

    The guarantee of all fits together is computed by the ledger's accountant on the composition of
    their events, never by adding ε's.  A fit that would take the composition past ``epsilon`` (at
    the ledger's ``delta``) is refused before it runs.

    Parameters
    ----------
    epsilon, delta
        The total budget.  It is fixed when a stored ledger is created: opening it again with
        another budget, relation or accountant is refused.
    accountant
        Name of the accountant plugin that composes the charges.
    relation
        The neighbour relation of the budget; every charge must be declared under it.
    path
        A SQLite database file that keeps the ledger between sessions and shares it between the
        processes that open it; created if missing.  Keep it on a local disk (SQLite's locks are
        unreliable on network file systems) and use ``url`` to share a budget between machines.
        An old JSON ledger at ``path`` is migrated to SQLite in place, its JSON kept as
        ``<path>.bak``.
    url
        A PostgreSQL database, ``postgresql://user@host:port/database``, that keeps the ledger
        for everyone who connects to it (needs ``pip install "dpppl[postgres]"``).  The ledger's
        tables are created if missing.
    name
        The ledger's name inside its database: one database can hold the budgets of several data
        sets.
    timeout
        Seconds to wait for another process's charge to finish before giving up.

    Examples
    --------
    >>> ledger = dpppl.PrivacyLedger(epsilon=2.0, delta=1e-5, path="adult-budget.sqlite")
    >>> with model:
    ...     idata = dpppl.sample(mechanism="na-dpvi", epsilon=1.0, delta=1e-6, ledger=ledger)
    >>> ledger.spent()

    A team's shared budget:

    >>> ledger = dpppl.PrivacyLedger(
    ...     epsilon=2.0, delta=1e-5, url="postgresql://alice@db.example.org/budgets", name="adult"
    ... )
    """

    def __init__(
        self,
        epsilon: float,
        delta: float,
        accountant: str = "pld",
        relation: NeighbourRelation | str = NeighbourRelation.ADD_OR_REMOVE_ONE,
        path: str | os.PathLike[str] | None = None,
        *,
        url: str | None = None,
        name: str = "default",
        timeout: float = 60.0,
    ) -> None:
        self.epsilon, self.delta = check_epsilon_delta(epsilon, delta)
        self.relation = NeighbourRelation(relation)
        self.accountant = accountant
        # An unknown accountant is refused now rather than stored with the budget.
        get_accountant(accountant)
        if path is not None and url is not None:
            raise ValueError("give path= (a SQLite file) or url= (a PostgreSQL database), not both")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.path = None if path is None else Path(path)
        self.url = url
        self.name = name
        self.timeout = float(timeout)
        self._store: _Store
        if url is not None:
            self._store = _PostgresStore(url, name, self.timeout)
        elif self.path is not None:
            if _is_json_file(self.path):
                _migrate_json_ledger(self.path, name, self.timeout)
            self._store = _SQLiteStore(self.path, name, self.timeout)
        else:
            self._store = _MemoryStore()
        self._check_budget(self._store.open(self._budget()))

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(epsilon={self.epsilon!r}, delta={self.delta!r}, "
            f"accountant={self.accountant!r}, relation={self.relation.value!r}{self._location()})"
        )

    def _location(self) -> str:
        """The storage arguments, as they would be passed (a URL without credentials)."""
        where = ""
        if self.path is not None:
            where = f", path={str(self.path)!r}"
        elif self.url is not None:
            where = f", url={_public_address(self.url)!r}"
        if self.name != "default":
            where += f", name={self.name!r}"
        return where

    @property
    def entries(self) -> list[LedgerEntry]:
        """The charges so far, oldest first, as stored now (other processes' charges included)."""
        return self._store.read()

    def spent(self) -> float:
        """ε of all charges so far at the ledger's δ.

        The accountant composes their events at the ledger's δ less the δ the fits spent outside
        their events (:attr:`LedgerEntry.extra_delta`), scaled by e^(−Σγ), and 2Σγ is added
        (:attr:`LedgerEntry.max_divergence`).
        """
        return self._epsilon_of(*self._composed(self.entries))

    def check(
        self,
        event: PrivacyEvent | None,
        relation: NeighbourRelation,
        *,
        epsilon: float = 0.0,
        extra_delta: float = 0.0,
        max_divergence: float = 0.0,
    ) -> float:
        """ε the ledger would have spent after charging ``event``; raise if over budget.

        A dry run: another process may charge before you do.  :meth:`charge` checks again.

        Parameters
        ----------
        event, relation
            The fit's declared event and neighbour relation.
        epsilon, extra_delta
            The fit's own ε, and the part of its δ spent outside ``event``
            (:attr:`dpppl.plugin.mechanism.PrivacyPlan.extra_delta`), a total-variation term that the
            ledger converts at the ε it claims for the composition.
        max_divergence
            The fit's γ (:attr:`dpppl.plugin.mechanism.PrivacyPlan.max_divergence`).

        Raises
        ------
        PrivacyBudgetExceededError
            If the composition would exceed the budget, or the event cannot be composed here.
        """
        entry = LedgerEntry(
            event, NeighbourRelation(relation), "", epsilon, 0.0, extra_delta, max_divergence
        )
        return self._spent_after(self.entries, entry)

    def charge(
        self,
        event: PrivacyEvent | None,
        relation: NeighbourRelation,
        *,
        label: str,
        epsilon: float,
        delta: float,
        extra_delta: float = 0.0,
        max_divergence: float = 0.0,
    ) -> float:
        """Check ``event`` against the budget, record it, and return ε spent after it.

        Check and record are one transaction on the stored ledger: concurrent charges from other
        processes queue (up to ``timeout`` seconds), and each composes every charge stored before
        it.

        Parameters
        ----------
        event, relation
            The fit's declared event and neighbour relation.
        label
            A public description of the fit (the mechanism's name, for ``dpppl.sample``).
        epsilon, delta, extra_delta, max_divergence
            The fit's own guarantee, the part of its δ spent outside ``event`` and its γ (see
            :meth:`check`).

        Raises
        ------
        PrivacyBudgetExceededError
            If the composition would exceed the budget, or the event cannot be composed here;
            nothing is recorded.
        InvalidPrivacyParameterError
            If the stored ledger's budget has changed since it was opened.
        """
        entry = LedgerEntry(
            event, NeighbourRelation(relation), label, float(epsilon), float(delta),
            float(extra_delta), float(max_divergence),
        )
        after = math.nan

        def admit(stored: _Budget, entries: list[LedgerEntry]) -> None:
            nonlocal after
            self._check_budget(stored)
            after = self._spent_after(entries, entry)

        self._store.append(entry, admit)
        return after

    # -- composition ------------------------------------------------------------------------------

    def _accountant(self) -> Accountant:
        return get_accountant(self.accountant)()

    def _epsilon_of(
        self, events: list[PrivacyEvent], variation: float, divergence: float = 0.0
    ) -> float:
        """ε of ``events`` composed at the ledger's δ, with total variation ``variation`` spent
        outside them and the fits' output laws within a factor e^(±``divergence``) of what they
        cover.

        A mechanism within total variation η of an (ε, δ')-DP one is (ε, δ' + (1 + e^ε)·η)-DP,
        and one within a factor e^(±γ) of it is (ε + 2γ, e^γ δ')-DP (the proof in
        :class:`dpppl.privacy.noise.SnappedGaussian`), so the ε the ledger may claim is a fixed
        point ε = ε_events((δ − (1 + e^ε)·η) e^(−γ)) + 2γ.  It is reached from below (the map
        grows with ε) and the answer is checked to satisfy it.
        """
        if not events:
            return 0.0
        composed = ComposedEvent(tuple(events))

        def at(epsilon: float) -> float:
            remaining = self.delta - total_variation_delta(epsilon, variation)
            if remaining <= 0:
                raise PrivacyBudgetExceededError(
                    f"the fits spend delta={self.delta - remaining:.4g} outside their declared "
                    f"events at epsilon={epsilon:.4g}, which uses up the ledger's "
                    f"delta={self.delta:g}; nothing was run"
                )
            accounted = remaining * math.exp(-divergence)
            bound = self._accountant().epsilon(composed, delta=accounted, relation=self.relation)
            return bound + 2 * divergence

        epsilon = at(0.0)
        for _ in range(_FIXED_POINT_ITERATIONS):
            if variation == 0:
                return epsilon
            claimed = epsilon * (1 + _FIXED_POINT_RTOL)
            if at(claimed) <= claimed:
                return claimed
            epsilon = at(epsilon)
        raise PrivacyBudgetExceededError(
            f"the delta the fits spend outside their declared events does not settle at the "
            f"ledger's delta={self.delta:g}; nothing was run"
        )

    def _composed(self, entries: list[LedgerEntry]) -> tuple[list[PrivacyEvent], float, float]:
        """The entries' events, the total variation they spent outside them and their summed
        max-divergence."""
        events = [e.event for e in entries]
        variation = sum(_variation(e.epsilon, e.extra_delta) for e in entries)
        return events, variation, sum(e.max_divergence for e in entries)

    def _spent_after(self, entries: list[LedgerEntry], entry: LedgerEntry) -> float:
        """ε of ``entries`` and the new ``entry`` composed; raise if over budget."""
        event, relation = entry.event, entry.relation
        if event is None:
            raise PrivacyBudgetExceededError(
                "this mechanism declares no accountable privacy event (its guarantee is of another "
                "kind), so a ledger cannot compose it; run it without a ledger"
            )
        if relation != self.relation:
            raise PrivacyBudgetExceededError(
                f"the ledger is kept under {self.relation.value} but this fit is private under "
                f"{relation.value}; use a ledger with relation={relation.value!r}"
            )
        events, variation, divergence = self._composed(entries)
        try:
            after = self._epsilon_of(
                [*events, event],
                variation + _variation(entry.epsilon, entry.extra_delta),
                divergence + entry.max_divergence,
            )
        except UnsupportedEventError as error:
            raise PrivacyBudgetExceededError(
                f"the ledger's accountant {self.accountant!r} cannot compose this fit: {error}"
            ) from error
        if after > self.epsilon:
            raise PrivacyBudgetExceededError(
                f"this fit would bring the ledger to epsilon={after:.4g} at delta={self.delta:g}, "
                f"over its budget of epsilon={self.epsilon:g} (spent so far: "
                f"{self._epsilon_of(events, variation, divergence):.4g}); nothing was run. Ask "
                "for a smaller epsilon or use a new data set"
            )
        return after

    # -- the stored budget ------------------------------------------------------------------------

    def _budget(self) -> _Budget:
        return _Budget(self.epsilon, self.delta, self.relation.value, self.accountant)

    def _check_budget(self, stored: _Budget) -> None:
        given = self._budget()
        if stored == given:
            return
        differ = ", ".join(
            f"{key}={value!r}"
            for key, value in given.arguments().items()
            if stored.arguments()[key] != value
        )
        stored_arguments = ", ".join(f"{k}={v!r}" for k, v in stored.arguments().items())
        raise InvalidPrivacyParameterError(
            f"the ledger {self.name!r} in {self._store.where} was created with "
            f"{stored_arguments}, but was opened with {differ}; a budget is fixed when its ledger "
            f"is created. Open it with PrivacyLedger({stored_arguments}{self._location()})"
        )


#: Iterations and relative slack of the fixed point ε = ε_events(δ − (1 + e^ε)·η).
_FIXED_POINT_ITERATIONS = 20
_FIXED_POINT_RTOL = 1e-6


def _variation(epsilon: float, extra_delta: float) -> float:
    """The total variation η behind a fit's ``extra_delta``, which it reported as (1 + e^ε)·η at
    its own ε (see :attr:`dpppl.plugin.mechanism.PrivacyPlan.extra_delta`)."""
    return extra_delta / total_variation_delta(epsilon, 1.0) if extra_delta else 0.0


# -- storage --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Budget:
    """What a stored ledger was created with; compared exactly (floats round-trip unchanged)."""

    epsilon: float
    delta: float
    relation: str
    accountant: str

    def arguments(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "relation": self.relation,
            "accountant": self.accountant,
        }


#: Called with the stored budget and entries while the ledger's write lock is held; raises to
#: refuse the new entry.
Admit = Callable[[_Budget, list[LedgerEntry]], None]


class _Store(ABC):
    """Where a ledger's budget and entries live."""

    #: Where the ledger is, for messages (never a password).
    where: str

    @abstractmethod
    def open(self, budget: _Budget) -> _Budget:
        """Create the ledger with ``budget`` if it does not exist; return the stored budget."""

    @abstractmethod
    def read(self) -> list[LedgerEntry]:
        """The stored entries, oldest first."""

    @abstractmethod
    def append(self, entry: LedgerEntry, admit: Admit) -> None:
        """Under the ledger's write lock: read the stored budget and entries, let ``admit`` refuse
        ``entry`` by raising, and store it otherwise."""


class _MemoryStore(_Store):
    where = "memory"

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []
        self._created: _Budget
        # Threads of one session may share an in-memory ledger.
        self._lock = threading.Lock()

    def open(self, budget: _Budget) -> _Budget:
        self._created = budget
        return budget

    def read(self) -> list[LedgerEntry]:
        with self._lock:
            return list(self._entries)

    def append(self, entry: LedgerEntry, admit: Admit) -> None:
        with self._lock:
            admit(self._created, list(self._entries))
            self._entries.append(entry)


#: Runs one SQL statement (``?`` placeholders) in the current transaction; returns its rows.
Run = Callable[..., list[tuple]]

_TABLES = (
    """CREATE TABLE IF NOT EXISTS dpppl_ledgers (
        name TEXT PRIMARY KEY,
        epsilon DOUBLE PRECISION NOT NULL,
        delta DOUBLE PRECISION NOT NULL,
        relation TEXT NOT NULL,
        accountant TEXT NOT NULL
    )""",
    # (ledger, seq) is unique: were two charges ever to read the same entries, the second insert
    # would fail rather than both be recorded.
    """CREATE TABLE IF NOT EXISTS dpppl_ledger_entries (
        ledger TEXT NOT NULL REFERENCES dpppl_ledgers (name),
        seq INTEGER NOT NULL,
        event TEXT NOT NULL,
        relation TEXT NOT NULL,
        label TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL,
        delta DOUBLE PRECISION NOT NULL,
        extra_delta DOUBLE PRECISION NOT NULL,
        max_divergence DOUBLE PRECISION NOT NULL DEFAULT 0,
        PRIMARY KEY (ledger, seq)
    )""",
)
#: Adds the column that ledgers created before it lack; their entries spent no max-divergence.
_ADD_MAX_DIVERGENCE = (
    "ALTER TABLE dpppl_ledger_entries "
    "ADD COLUMN max_divergence DOUBLE PRECISION NOT NULL DEFAULT 0"
)


class _SQLStore(_Store):
    """A ledger in a SQL database; subclasses open transactions and take the write lock."""

    #: Statements that create the tables, run in the transaction of :meth:`open`.
    setup: tuple[str, ...] = _TABLES
    #: Appended to the budget query of a charge: takes a row lock where the database has them.
    lock_clause = ""

    def __init__(self, name: str, where: str) -> None:
        self.name = name
        self.where = where

    @abstractmethod
    def _transaction(self, *, write: bool) -> AbstractContextManager[Run]:
        """A transaction, committed if the block succeeds; ``write=True`` holds the write lock
        before the first statement runs."""

    @abstractmethod
    def _entry_columns(self, run: Run) -> set[str]:
        """The columns of the stored entries' table."""

    def open(self, budget: _Budget) -> _Budget:
        with self._transaction(write=True) as run:
            for statement in self.setup:
                run(statement)
            if "max_divergence" not in self._entry_columns(run):
                run(_ADD_MAX_DIVERGENCE)
            stored = self._stored_budget(run, lock="")
            if stored is not None:
                return stored
            run(
                "INSERT INTO dpppl_ledgers (name, epsilon, delta, relation, accountant) "
                "VALUES (?, ?, ?, ?, ?)",
                (self.name, budget.epsilon, budget.delta, budget.relation, budget.accountant),
            )
            return budget

    def read(self) -> list[LedgerEntry]:
        with self._transaction(write=False) as run:
            return self._entries(run)

    def append(self, entry: LedgerEntry, admit: Admit) -> None:
        with self._transaction(write=True) as run:
            stored = self._stored_budget(run, lock=self.lock_clause)
            if stored is None:
                raise InvalidPrivacyParameterError(
                    f"the ledger {self.name!r} no longer exists in {self.where}"
                )
            entries = self._entries(run)
            admit(stored, entries)
            run(
                "INSERT INTO dpppl_ledger_entries "
                "(ledger, seq, event, relation, label, epsilon, delta, extra_delta, "
                "max_divergence) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self.name,
                    len(entries),
                    entry.event.to_json(),
                    entry.relation.value,
                    entry.label,
                    entry.epsilon,
                    entry.delta,
                    entry.extra_delta,
                    entry.max_divergence,
                ),
            )

    def _stored_budget(self, run: Run, *, lock: str) -> _Budget | None:
        rows = run(
            "SELECT epsilon, delta, relation, accountant FROM dpppl_ledgers WHERE name = ?" + lock,
            (self.name,),
        )
        return _Budget(*rows[0]) if rows else None

    def _entries(self, run: Run) -> list[LedgerEntry]:
        rows = run(
            "SELECT event, relation, label, epsilon, delta, extra_delta, max_divergence "
            "FROM dpppl_ledger_entries WHERE ledger = ? ORDER BY seq",
            (self.name,),
        )
        return [
            LedgerEntry(event_from_json(event), NeighbourRelation(relation), *rest)
            for event, relation, *rest in rows
        ]


class _SQLiteStore(_SQLStore):
    def __init__(self, path: Path, name: str, timeout: float) -> None:
        super().__init__(name, where=str(path))
        # Absolute, so that a later chdir cannot point the ledger at another file.
        self.path = path.absolute()
        self.timeout = timeout

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Run]:
        # isolation_level=None: the transactions below are the only ones, begun and ended here.
        connection = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            # BEGIN IMMEDIATE takes the database's write lock before the entries are read, so
            # concurrent charges queue (up to the busy timeout); after a deferred BEGIN several
            # would read the same entries and all but one fail to write.
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield lambda sql, parameters=(): connection.execute(sql, parameters).fetchall()
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
        finally:
            connection.close()

    def _entry_columns(self, run: Run) -> set[str]:
        return {row[1] for row in run("PRAGMA table_info(dpppl_ledger_entries)")}


class _PostgresStore(_SQLStore):
    # Concurrent CREATE TABLE IF NOT EXISTS can fail on PostgreSQL's catalog; a transaction-level
    # advisory lock makes ledgers that open at once create the tables one after the other.
    setup = ("SELECT pg_advisory_xact_lock(hashtext('dpppl ledger tables'))", *_TABLES)
    # The ledger's row in dpppl_ledgers is its lock: a charge holds it from reading the budget
    # until it commits, and READ COMMITTED lets the next charge see the entry once it gets it.
    lock_clause = " FOR UPDATE"

    def __init__(self, url: str, name: str, timeout: float) -> None:
        if urllib.parse.urlsplit(url).scheme not in ("postgresql", "postgres"):
            raise ValueError(
                "url= takes a PostgreSQL URL such as postgresql://user@host/database; for a "
                "SQLite file use path="
            )
        _psycopg()  # a missing psycopg is reported now, not at the first charge
        super().__init__(name, where=_public_address(url))
        self.url = url
        self.timeout = timeout

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Run]:
        # One kind of transaction for reads and writes: a charge's lock is the row lock that
        # lock_clause takes, and autocommit=True leaves the transaction to transaction().
        with (
            _psycopg().connect(self.url, autocommit=True) as connection,
            connection.transaction(),
        ):
            connection.execute(
                "SELECT set_config('lock_timeout', %s, true)", (f"{round(self.timeout * 1000)}ms",)
            )

            def run(sql: str, parameters: tuple = ()) -> list[tuple]:
                cursor = connection.execute(sql.replace("?", "%s"), parameters)
                return cursor.fetchall() if cursor.description is not None else []

            yield run

    def _entry_columns(self, run: Run) -> set[str]:
        rows = run(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'dpppl_ledger_entries' AND table_schema = current_schema()"
        )
        return {row[0] for row in rows}


def _psycopg() -> ModuleType:
    # Imported on demand: psycopg is an optional dependency that only PostgreSQL ledgers need.
    try:
        import psycopg
    except ImportError:
        raise ImportError(
            'a PostgreSQL ledger needs psycopg 3: pip install "dpppl[postgres]"'
        ) from None
    return psycopg


def _public_address(url: str) -> str:
    """``url`` without its user name, password or options: safe for messages and reprs."""
    parts = urllib.parse.urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


# -- JSON ledgers (the format before SQLite) ------------------------------------------------------

_SQLITE_HEADER = b"SQLite format 3\x00"


def _is_json_file(path: Path) -> bool:
    """Whether ``path`` is a file with content that is not a SQLite database."""
    try:
        with path.open("rb") as file:
            head = file.read(len(_SQLITE_HEADER))
    except (FileNotFoundError, IsADirectoryError):
        return False
    return bool(head) and head != _SQLITE_HEADER


def _migrate_json_ledger(path: Path, name: str, timeout: float) -> None:
    """Replace the JSON ledger at ``path`` by a SQLite ledger with its budget and entries, keeping
    the JSON as ``<path>.bak``.

    ``path`` always holds one of the two: the database replaces the JSON in one rename, so a
    process that opens the ledger meanwhile never finds it missing (and never starts a new one).
    """
    # fcntl is Unix-only and only migration needs it: imported here, the ledger stays portable.
    import fcntl

    with path.open("rb") as file:
        # Processes that open the old file at once queue here; the first migrates it, and the
        # others find that ``path`` has become a database when their turn comes.
        fcntl.flock(file, fcntl.LOCK_EX)
        text = file.read()
        if text.startswith(_SQLITE_HEADER) or not _is_same_file(file.fileno(), path):
            return
        budget, entries = _read_json_ledger(path, text)
        backup = path.with_name(path.name + ".bak")
        if backup.exists() and backup.read_bytes() != text:
            raise ValueError(
                f"cannot migrate the JSON ledger {path} to SQLite: its backup {backup} exists and "
                "differs from it. Move the backup away and open the ledger again"
            )
        temporary = path.with_name(f"{path.name}.migrating-{uuid.uuid4().hex}")
        try:
            store = _SQLiteStore(temporary, name, timeout)
            store.open(budget)
            for entry in entries:
                store.append(entry, _admitted_before)
            backup.write_bytes(text)
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    warnings.warn(
        f"migrated the JSON ledger {path} to a SQLite database at the same path; the JSON file "
        f"is kept as {backup}",
        UserWarning,
        stacklevel=3,
    )


def _admitted_before(stored: _Budget, entries: list[LedgerEntry]) -> None:
    """The JSON ledger admitted its entries already; migration copies them as they are."""


def _is_same_file(descriptor: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(descriptor), os.stat(path))
    except FileNotFoundError:
        return False


def _read_json_ledger(path: Path, text: bytes) -> tuple[_Budget, list[LedgerEntry]]:
    try:
        stored = json.loads(text)
        budget = _Budget(
            float(stored["epsilon"]),
            float(stored["delta"]),
            NeighbourRelation(stored["relation"]).value,
            str(stored["accountant"]),
        )
        return budget, [LedgerEntry.from_dict(entry) for entry in stored["entries"]]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is neither a ledger database nor a JSON ledger ({error!r}); give a path to "
            "a new file or to an existing ledger"
        ) from None
