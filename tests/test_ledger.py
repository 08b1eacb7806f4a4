"""The privacy ledger: charges composed by the accountant, refused over budget, kept in a database
that processes share without ever spending more than the budget or losing a charge."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import sqlite3
import sys
import threading
import urllib.parse
import uuid
from pathlib import Path

import numpy as np
import pytest

import dpppl
from dpppl import InvalidPrivacyParameterError, PrivacyBudgetExceededError, PrivacyLedger
from dpppl.plugin.registry import get_accountant
from dpppl.privacy.events import (
    ComposedEvent,
    GaussianEvent,
    NeighbourRelation,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    poisson_subsampled_gaussian,
)

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE
REPLACE = NeighbourRelation.REPLACE_ONE
DELTA = 1e-5
FIT = poisson_subsampled_gaussian(3.0, 0.05, 100)  # ε = 0.65 at δ = 1e-5 under pld, 0.72 under rdp
#: One DP-SGD fit of ε = 0.60 under rdp at δ = 1e-5; two compose to 0.85 and three to 1.05, so a
#: budget of ε = 1 holds two.  (Fits of 0.45 would not do: rdp composes four of them to 0.99.)
HALF_BUDGET_FIT = poisson_subsampled_gaussian(1.7, 0.01, 500)


def rdp_epsilon(*events, delta: float = DELTA) -> float:
    return get_accountant("rdp")().epsilon(
        ComposedEvent(tuple(events)), delta=delta, relation=ADD_REMOVE
    )


# composing and refusing -------------------------------------------------------------------------


def test_charges_are_composed_by_the_accountant_not_added():
    pld = get_accountant("pld")()
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="pld")
    alone = ledger.charge(FIT, ADD_REMOVE, label="first", epsilon=0.65, delta=DELTA)
    both = ledger.charge(FIT, ADD_REMOVE, label="second", epsilon=0.65, delta=DELTA)
    assert alone == pytest.approx(pld.epsilon(FIT, delta=DELTA, relation=ADD_REMOVE))
    assert both == pytest.approx(
        pld.epsilon(ComposedEvent((FIT, FIT)), delta=DELTA, relation=ADD_REMOVE)
    )
    assert alone < both < 2 * alone
    assert ledger.spent() == pytest.approx(both)
    assert [entry.label for entry in ledger.entries] == ["first", "second"]


def test_a_fit_that_would_exceed_the_budget_is_refused_and_changes_nothing(tmp_path):
    path = tmp_path / "budget.sqlite"
    ledger = PrivacyLedger(epsilon=0.8, delta=DELTA, accountant="pld", path=path)
    ledger.charge(FIT, ADD_REMOVE, label="first", epsilon=0.65, delta=DELTA)
    stored = path.read_bytes()
    with pytest.raises(PrivacyBudgetExceededError, match="over its budget"):
        ledger.charge(FIT, ADD_REMOVE, label="second", epsilon=0.65, delta=DELTA)
    assert [entry.label for entry in ledger.entries] == ["first"]
    assert path.read_bytes() == stored


def test_a_fit_under_another_neighbour_relation_is_refused():
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, relation=ADD_REMOVE)
    with pytest.raises(PrivacyBudgetExceededError, match="replace_one"):
        ledger.charge(
            SelfComposedEvent(GaussianEvent(5.0), 10), REPLACE, label="x", epsilon=1, delta=DELTA
        )
    assert ledger.entries == []


def test_an_event_the_ledgers_accountant_cannot_compose_is_refused_with_its_reason():
    without_replacement = SelfComposedEvent(
        SampledWithoutReplacementEvent(1000, 10, GaussianEvent(2.0)), 50
    )
    pld_ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="pld", relation=REPLACE)
    with pytest.raises(PrivacyBudgetExceededError, match="'pld' cannot compose"):
        pld_ledger.charge(without_replacement, REPLACE, label="sep", epsilon=1, delta=DELTA)
    assert pld_ledger.entries == []

    rdp_ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", relation=REPLACE)
    spent = rdp_ledger.charge(without_replacement, REPLACE, label="sep", epsilon=1, delta=DELTA)
    assert 0 < spent < 3


def test_a_mechanism_without_an_accountable_event_is_refused():
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA)
    with pytest.raises(PrivacyBudgetExceededError, match="no accountable privacy event"):
        ledger.charge(None, ADD_REMOVE, label="swag", epsilon=1.0, delta=DELTA)


# a ledger in a SQLite file ----------------------------------------------------------------------


def test_a_ledger_survives_a_restart_through_its_database_file(tmp_path):
    path = tmp_path / "budget.sqlite"
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
    ledger.charge(FIT, ADD_REMOVE, label="fit", epsilon=0.72, delta=DELTA, extra_delta=1e-12)

    reopened = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
    assert reopened.entries == ledger.entries
    assert reopened.entries[0].event == FIT and reopened.entries[0].extra_delta == 1e-12
    assert reopened.spent() == ledger.spent()


def test_two_ledger_objects_on_one_file_never_overspend_the_budget(tmp_path):
    # The reviewer's reproduction (F3): two notebooks open one ledger, and each runs a fit of
    # ε = 0.725; together they would spend 1.013 of a budget of 1.
    path = tmp_path / "budget.sqlite"
    first = PrivacyLedger(epsilon=1.0, delta=DELTA, accountant="rdp", path=path)
    second = PrivacyLedger(epsilon=1.0, delta=DELTA, accountant="rdp", path=path)
    fit = poisson_subsampled_gaussian(1.5, 0.01, 500)
    first.charge(fit, ADD_REMOVE, label="fit A", epsilon=0.725, delta=DELTA)
    with pytest.raises(PrivacyBudgetExceededError, match="over its budget"):
        second.charge(fit, ADD_REMOVE, label="fit B", epsilon=0.725, delta=DELTA)
    reopened = PrivacyLedger(epsilon=1.0, delta=DELTA, accountant="rdp", path=path)
    assert [entry.label for entry in reopened.entries] == ["fit A"]
    assert reopened.spent() == pytest.approx(rdp_epsilon(fit)) and reopened.spent() <= 1.0


def test_two_ledger_objects_on_one_file_lose_no_charge(tmp_path):
    path = tmp_path / "budget.sqlite"
    first = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
    second = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
    first.charge(FIT, ADD_REMOVE, label="fit A", epsilon=0.72, delta=DELTA)
    after_both = second.charge(FIT, ADD_REMOVE, label="fit B", epsilon=0.72, delta=DELTA)
    assert after_both == pytest.approx(rdp_epsilon(FIT, FIT))
    for ledger in (first, second, PrivacyLedger(3.0, DELTA, "rdp", path=path)):
        assert [entry.label for entry in ledger.entries] == ["fit A", "fit B"]
        assert ledger.spent() == pytest.approx(after_both)


@pytest.mark.parametrize(
    "changed",
    [{"epsilon": 5.0}, {"delta": 1e-6}, {"relation": "replace_one"}, {"accountant": "rdp"}],
    ids=lambda changed: next(iter(changed)),
)
def test_a_stored_ledger_opened_with_another_budget_relation_or_accountant_is_refused(
    tmp_path, changed
):
    path = tmp_path / "budget.sqlite"
    created = {"epsilon": 3.0, "delta": DELTA, "relation": "add_or_remove_one", "accountant": "pld"}
    PrivacyLedger(**created, path=path).charge(
        FIT, ADD_REMOVE, label="fit", epsilon=0.65, delta=DELTA
    )
    (key, value), = changed.items()
    with pytest.raises(InvalidPrivacyParameterError) as refusal:
        PrivacyLedger(**{**created, **changed}, path=path)
    message = str(refusal.value)
    assert f"opened with {key}={value!r}" in message
    assert (
        "Open it with PrivacyLedger(epsilon=3.0, delta=1e-05, relation='add_or_remove_one', "
        f"accountant='pld', path={str(path)!r})"
    ) in message
    assert len(PrivacyLedger(**created, path=path).entries) == 1


def test_concurrent_processes_never_overspend_the_budget(tmp_path, monkeypatch):
    race_processes(monkeypatch, {"path": str(tmp_path / "budget.sqlite")})


# old JSON ledgers -------------------------------------------------------------------------------


def write_json_ledger(path: Path, *labels: str) -> str:
    """A ledger file as dpppl wrote it before ledgers moved to SQLite; returns its text."""
    text = json.dumps(
        {
            "epsilon": 3.0,
            "delta": DELTA,
            "relation": "add_or_remove_one",
            "accountant": "rdp",
            "entries": [
                {"event": FIT.to_dict(), "relation": "add_or_remove_one", "label": label,
                 "epsilon": 0.72, "delta": DELTA}
                for label in labels
            ],
        },
        indent=2,
    )
    path.write_text(text)
    return text


def test_an_old_json_ledger_is_migrated_to_sqlite_and_kept_as_a_backup(tmp_path):
    path = tmp_path / "budget.json"
    text = write_json_ledger(path, "fit A", "fit B")
    with pytest.warns(UserWarning, match="migrated the JSON ledger"):
        ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
    assert [entry.label for entry in ledger.entries] == ["fit A", "fit B"]
    assert ledger.spent() == pytest.approx(rdp_epsilon(FIT, FIT))
    # The user's code keeps its path: it now names the database, and the JSON lies beside it.
    assert path.read_bytes().startswith(b"SQLite format 3\x00")
    assert Path(f"{path}.bak").read_text() == text
    ledger.charge(FIT, ADD_REMOVE, label="fit C", epsilon=0.72, delta=DELTA)
    reopened = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
    assert [entry.label for entry in reopened.entries] == ["fit A", "fit B", "fit C"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.json", "budget.json.bak"]


def test_an_old_json_ledger_opened_by_several_threads_at_once_is_migrated_once(tmp_path):
    # Each thread opens the JSON ledger and charges it at once: a migration that replaced the
    # database after another thread had charged it would lose that charge.
    path = tmp_path / "budget.json"
    write_json_ledger(path, "old fit")
    get_accountant("rdp")  # load the plugins before the threads race
    barrier = threading.Barrier(4)
    outcomes: dict[str, object] = {}

    def open_and_charge(label: str) -> None:
        try:
            barrier.wait(timeout=30)
            ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
            outcomes[label] = ledger.charge(FIT, ADD_REMOVE, label=label, epsilon=0.72, delta=DELTA)
        except BaseException as error:  # noqa: BLE001 - reported below
            outcomes[label] = error

    threads = [threading.Thread(target=open_and_charge, args=(f"fit {i}",)) for i in range(4)]
    with pytest.warns(UserWarning, match="migrated the JSON ledger"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert all(isinstance(outcome, float) for outcome in outcomes.values()), outcomes
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
    labels = [entry.label for entry in ledger.entries]
    assert labels[0] == "old fit" and sorted(labels[1:]) == [f"fit {i}" for i in range(4)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.json", "budget.json.bak"]


def test_a_ledger_file_from_before_max_divergence_gains_the_column_and_keeps_its_charges(
    tmp_path,
):
    path = tmp_path / "budget.sqlite"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE dpppl_ledgers (name TEXT PRIMARY KEY, epsilon DOUBLE PRECISION NOT NULL,
            delta DOUBLE PRECISION NOT NULL, relation TEXT NOT NULL, accountant TEXT NOT NULL);
        CREATE TABLE dpppl_ledger_entries (
            ledger TEXT NOT NULL REFERENCES dpppl_ledgers (name), seq INTEGER NOT NULL,
            event TEXT NOT NULL, relation TEXT NOT NULL, label TEXT NOT NULL,
            epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
            extra_delta DOUBLE PRECISION NOT NULL, PRIMARY KEY (ledger, seq));
    """)
    old.execute("INSERT INTO dpppl_ledgers VALUES ('default', 3.0, ?, ?, 'rdp')",
                (DELTA, ADD_REMOVE.value))
    old.execute("INSERT INTO dpppl_ledger_entries VALUES ('default', 0, ?, ?, 'old fit', 0.72, ?, 0)",
                (FIT.to_json(), ADD_REMOVE.value, DELTA))
    old.commit()
    old.close()

    ledger = PrivacyLedger(3.0, DELTA, "rdp", path=path)
    assert [(e.label, e.max_divergence) for e in ledger.entries] == [("old fit", 0.0)]
    ledger.charge(FIT, ADD_REMOVE, label="new fit", epsilon=0.73, delta=DELTA,
                  max_divergence=1e-3)
    reopened = PrivacyLedger(3.0, DELTA, "rdp", path=path)
    assert [(e.label, e.max_divergence) for e in reopened.entries] == [
        ("old fit", 0.0), ("new fit", 1e-3)
    ]
    assert reopened.spent() == pytest.approx(
        rdp_epsilon(FIT, FIT, delta=DELTA * np.exp(-1e-3)) + 2e-3, rel=1e-9)


def test_a_file_that_is_not_a_ledger_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a ledger")
    with pytest.raises(ValueError, match="neither a ledger database nor a JSON ledger"):
        PrivacyLedger(epsilon=3.0, delta=DELTA, path=path)
    assert path.read_text() == "not a ledger"


# δ spent outside the declared events ------------------------------------------------------------


def test_the_ledger_counts_the_delta_a_fit_spends_outside_its_event(model_factories):
    # NA-DPVI truncates batches to a fixed shape and pays for it with a share of δ that lies
    # outside its event; a ledger with the fit's own budget must spend at least the fit's ε.
    model = model_factories["linear_regression"](np.random.default_rng(1))
    ledger = PrivacyLedger(epsilon=1.0, delta=DELTA)
    with model:
        result = dpppl.sample(
            mechanism="na-dpvi", epsilon=1.0, delta=DELTA, ledger=ledger, random_seed=0,
            progressbar=False, steps=300, tune=100, draws=100, chains=2, mc_draws=2,
        )
    assert json.loads(result.attrs["dp_privacy_details"])["truncation_delta"] > 0
    assert ledger.spent() >= result.attrs["dp_epsilon"]


def test_a_charge_whose_extra_delta_uses_up_the_ledgers_delta_is_refused():
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp")
    with pytest.raises(PrivacyBudgetExceededError, match="outside their declared events"):
        ledger.charge(FIT, ADD_REMOVE, label="fit", epsilon=0.72, delta=DELTA, extra_delta=DELTA)
    assert ledger.entries == []


def test_extra_delta_is_converted_at_the_epsilon_the_ledger_claims():
    """(1 + e^ε)·η reported at the fit's ε = 0.72 costs (1 + e^ε')·η at the ε' the ledger claims:
    the claim holds at δ less that, and no smaller claim would."""
    rdp = get_accountant("rdp")()
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp")
    eta = 1e-7
    spent = ledger.charge(
        FIT, ADD_REMOVE, label="fit", epsilon=0.72, delta=DELTA, extra_delta=(1 + np.exp(0.72)) * eta
    )
    holds_at = DELTA - (1 + np.exp(spent)) * eta
    assert rdp.epsilon(FIT, delta=holds_at, relation=ADD_REMOVE) <= spent
    assert spent <= rdp.epsilon(FIT, delta=holds_at, relation=ADD_REMOVE) * (1 + 1e-5)


def test_a_large_budget_does_not_inflate_a_small_fits_extra_delta():
    """Converting at the budget's ε instead of the claimed one made a fit at ε = 1e-3 cost
    δ ≈ 1e35 against a budget of ε = 100."""
    ledger = PrivacyLedger(epsilon=100.0, delta=DELTA, accountant="rdp")
    spent = ledger.charge(FIT, ADD_REMOVE, label="fit", epsilon=0.72, delta=DELTA,
                          extra_delta=1e-4 * DELTA)
    assert spent < 1.0


def test_a_fits_max_divergence_adds_twice_itself_to_epsilon_and_scales_the_events_delta():
    """A fit whose output law is within a factor e^(±γ) of what its event covers (snapped noise's
    float error) is (ε_event(δ e^(−γ)) + 2γ)-DP, and two such fits cost 2(γ₁ + γ₂)."""
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp")
    gamma = 1e-3  # far above any real fit's, so that it shows
    spent = ledger.charge(FIT, ADD_REMOVE, label="fit", epsilon=0.73, delta=DELTA,
                          max_divergence=gamma)
    alone = rdp_epsilon(FIT, delta=DELTA * np.exp(-gamma))
    assert spent == pytest.approx(alone + 2 * gamma, rel=1e-9)
    assert spent > rdp_epsilon(FIT) + 2 * gamma
    both = ledger.check(FIT, ADD_REMOVE, epsilon=0.73, max_divergence=2 * gamma)
    composed = rdp_epsilon(FIT, FIT, delta=DELTA * np.exp(-3 * gamma))
    assert both == pytest.approx(composed + 6 * gamma, rel=1e-9)


# where a ledger lives ---------------------------------------------------------------------------


def test_a_ledger_takes_a_file_or_a_postgresql_url_not_both(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        PrivacyLedger(1.0, DELTA, path=tmp_path / "a.sqlite", url="postgresql://localhost/db")
    with pytest.raises(ValueError, match="PostgreSQL URL"):
        PrivacyLedger(1.0, DELTA, url="sqlite:///budget.sqlite")


def test_a_postgresql_ledger_without_psycopg_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what Python does when it is missing
    with pytest.raises(ImportError, match=r'pip install "dpppl\[postgres\]"'):
        PrivacyLedger(1.0, DELTA, url="postgresql://localhost/budgets")


# a ledger in PostgreSQL -------------------------------------------------------------------------


@pytest.fixture
def postgres_url():
    """A fresh schema on the server at DPPPL_TEST_POSTGRES_URL, dropped afterwards."""
    url = os.environ.get("DPPPL_TEST_POSTGRES_URL")
    if not url:
        pytest.skip(
            "set DPPPL_TEST_POSTGRES_URL=postgresql://user@host:port/database to run the "
            "PostgreSQL ledger tests"
        )
    psycopg = pytest.importorskip(
        "psycopg", reason='PostgreSQL ledgers need psycopg: pip install "dpppl[postgres]"'
    )
    schema = f"dpppl_test_{uuid.uuid4().hex}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    parts = urllib.parse.urlsplit(url)
    options = "options=" + urllib.parse.quote(f"-c search_path={schema}")
    yield parts._replace(query="&".join(q for q in (parts.query, options) if q)).geturl()
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.mark.postgres
def test_a_postgresql_ledger_survives_a_restart_and_refuses_another_budget(postgres_url):
    ledger = PrivacyLedger(3.0, DELTA, "rdp", url=postgres_url, name="adult")
    ledger.charge(FIT, ADD_REMOVE, label="fit A", epsilon=0.72, delta=DELTA, extra_delta=1e-12,
                  max_divergence=1e-9)
    other = PrivacyLedger(3.0, DELTA, "rdp", url=postgres_url, name="adult")
    other.charge(FIT, ADD_REMOVE, label="fit B", epsilon=0.72, delta=DELTA)

    reopened = PrivacyLedger(3.0, DELTA, "rdp", url=postgres_url, name="adult")
    assert reopened.entries == ledger.entries == other.entries
    assert [entry.label for entry in reopened.entries] == ["fit A", "fit B"]
    assert reopened.entries[0].event == FIT and reopened.entries[0].extra_delta == 1e-12
    assert reopened.entries[0].max_divergence == 1e-9
    # The fixed point for extra_delta claims up to 10⁻⁶ more; 2γ adds 2·10⁻⁹.
    assert reopened.spent() == pytest.approx(rdp_epsilon(FIT, FIT), rel=2e-6)
    with pytest.raises(InvalidPrivacyParameterError, match="opened with accountant='pld'") as refusal:
        PrivacyLedger(3.0, DELTA, "pld", url=postgres_url, name="adult")
    # Neither messages nor reprs show the URL's user, password or options.
    for shown in (str(refusal.value), repr(reopened)):
        assert "@" not in shown and "options" not in shown and "postgresql://" in shown
    # Another name is another budget in the same database.
    assert PrivacyLedger(1.0, DELTA, "pld", url=postgres_url, name="census").entries == []


@pytest.mark.postgres
def test_concurrent_processes_never_overspend_a_postgresql_budget(postgres_url, monkeypatch):
    race_processes(monkeypatch, {"url": postgres_url, "name": "adult"})


# the race ---------------------------------------------------------------------------------------


def race_processes(monkeypatch, storage: dict[str, str], processes: int = 4) -> None:
    """Start ``processes`` processes that each open the ledger on ``storage`` (budget ε = 1) and,
    released together, charge it with :data:`HALF_BUDGET_FIT`; check that exactly the charges
    that fit went through, one after the other, and that every one of them is stored."""
    fits = 2
    assert rdp_epsilon(*[HALF_BUDGET_FIT] * fits) <= 1.0 < rdp_epsilon(*[HALF_BUDGET_FIT] * 3)
    arguments = {"epsilon": 1.0, "delta": DELTA, "accountant": "rdp", **storage}
    # pytest imports this file by path, which spawned processes cannot repeat: the worker is a
    # module beside it, on a sys.path that the processes inherit when they start.
    monkeypatch.syspath_prepend(Path(__file__).parent)
    worker = importlib.import_module("ledger_processes").charge_when_released
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    started = [
        context.Process(
            target=worker,
            args=(arguments, HALF_BUDGET_FIT.to_json(), 0.6, f"fit {i}", barrier, results),
        )
        for i in range(processes)
    ]
    for process in started:
        process.start()
    try:
        outcomes = dict(results.get(timeout=300) for _ in started)
    finally:
        for process in started:
            process.join(timeout=60)
    charged = {label: spent for label, spent in outcomes.items() if spent != "refused"}
    assert all(isinstance(spent, float) for spent in charged.values()), outcomes
    assert len(charged) == fits and list(outcomes.values()).count("refused") == processes - fits
    # One after the other: each charge composed every charge stored before it.
    assert sorted(charged.values()) == pytest.approx(
        [rdp_epsilon(*[HALF_BUDGET_FIT] * k) for k in range(1, fits + 1)]
    )
    ledger = PrivacyLedger(**arguments)
    assert sorted(entry.label for entry in ledger.entries) == sorted(charged)
    assert ledger.spent() == pytest.approx(max(charged.values())) and ledger.spent() <= 1.0
    if "path" in storage:
        with sqlite3.connect(storage["path"]) as connection:
            assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
