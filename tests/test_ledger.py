"""The privacy ledger: charges composed by the accountant, refused over budget, kept on disk."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dpppl
from dpppl import InvalidPrivacyParameterError, PrivacyBudgetExceededError, PrivacyLedger
from dpppl.events import (
    ComposedEvent,
    GaussianEvent,
    NeighbourRelation,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    poisson_subsampled_gaussian,
)
from dpppl.plugins import get_accountant

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE
REPLACE = NeighbourRelation.REPLACE_ONE
DELTA = 1e-5
FIT = poisson_subsampled_gaussian(3.0, 0.05, 100)  # ε = 0.65 at δ = 1e-5 under pld, 0.72 under rdp


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
    path = tmp_path / "budget.json"
    ledger = PrivacyLedger(epsilon=0.8, delta=DELTA, accountant="pld", path=path)
    ledger.charge(FIT, ADD_REMOVE, label="first", epsilon=0.65, delta=DELTA)
    stored = path.read_text()
    with pytest.raises(PrivacyBudgetExceededError, match="over its budget"):
        ledger.charge(FIT, ADD_REMOVE, label="second", epsilon=0.65, delta=DELTA)
    assert [entry.label for entry in ledger.entries] == ["first"]
    assert path.read_text() == stored


def test_a_ledger_survives_a_restart_through_its_json_file(tmp_path):
    path = tmp_path / "budget.json"
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
    ledger.charge(FIT, ADD_REMOVE, label="fit", epsilon=0.72, delta=DELTA)
    stored = json.loads(path.read_text())
    assert stored["entries"][0]["event"] == FIT.to_dict()

    reopened = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp", path=path)
    assert reopened.entries == ledger.entries
    assert reopened.spent() == ledger.spent()


def test_a_stored_ledger_opened_with_another_budget_is_refused(tmp_path):
    path = tmp_path / "budget.json"
    PrivacyLedger(epsilon=3.0, delta=DELTA, path=path).charge(
        FIT, ADD_REMOVE, label="fit", epsilon=0.65, delta=DELTA
    )
    with pytest.raises(InvalidPrivacyParameterError, match="open it with those values"):
        PrivacyLedger(epsilon=5.0, delta=DELTA, path=path)


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


# δ spent outside the declared events ----------------------------------------------------------


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


def test_extra_delta_is_rescaled_from_the_fits_epsilon_to_the_budgets():
    # (1 + e^ε)·η reported at the fit's ε = 0.72 costs (1 + e^3)·η at the budget's ε = 3.
    rdp = get_accountant("rdp")()
    ledger = PrivacyLedger(epsilon=3.0, delta=DELTA, accountant="rdp")
    eta = 1e-8
    spent = ledger.charge(
        FIT, ADD_REMOVE, label="fit", epsilon=0.72, delta=DELTA, extra_delta=(1 + np.exp(0.72)) * eta
    )
    at = DELTA - (1 + np.exp(3.0)) * eta
    assert spent == pytest.approx(rdp.epsilon(FIT, delta=at, relation=ADD_REMOVE), rel=1e-12)
