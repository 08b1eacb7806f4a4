"""The core's noise calibration and privacy ledger, driven by the installed accountant plugins."""

from __future__ import annotations

import json

import pytest

from dpppl.accounting import PrivacyLedger
from dpppl.calibration import calibrate_noise_multiplier
from dpppl.errors import InvalidPrivacyParameterError, PrivacyBudgetExceededError
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


def dp_sgd(sigma: float):
    return poisson_subsampled_gaussian(sigma, 0.05, 100)


def rdp_epsilon_of(sigma: float) -> float:
    return get_accountant("rdp")().epsilon(dp_sgd(sigma), delta=DELTA, relation=ADD_REMOVE)


FIT = dp_sgd(3.0)  # ε = 0.65 at δ = 1e-5 under pld, 0.72 under rdp


# calibrate_noise_multiplier ------------------------------------------------------------------


@pytest.mark.parametrize("initial", [0.5, 50.0])
def test_calibration_lands_in_the_band_below_the_target_from_any_side(initial):
    sigma = calibrate_noise_multiplier(rdp_epsilon_of, 1.0, initial=initial)
    assert 0.99 <= rdp_epsilon_of(sigma) <= 1.0


def test_calibration_with_a_wide_tolerance_still_never_overshoots():
    sigma = calibrate_noise_multiplier(rdp_epsilon_of, 0.5, initial=1.0, rtol=0.5)
    assert 0.25 <= rdp_epsilon_of(sigma) <= 0.5


def test_calibration_refuses_a_target_no_noise_reaches():
    # ε of a fixed part of the event does not fall with σ: 8 unperturbed-σ steps at σ = 0.5.
    fixed = SelfComposedEvent(GaussianEvent(0.5), 8)
    pld = get_accountant("pld")()

    def epsilon_of(sigma: float) -> float:
        event = ComposedEvent((fixed, GaussianEvent(sigma)))
        return pld.epsilon(event, delta=DELTA, relation=ADD_REMOVE)

    with pytest.raises(InvalidPrivacyParameterError, match="no noise multiplier"):
        calibrate_noise_multiplier(epsilon_of, 1.0, initial=1.0, max_noise_multiplier=1e3)


def test_calibration_refuses_a_tolerance_outside_the_unit_interval():
    with pytest.raises(ValueError, match="rtol"):
        calibrate_noise_multiplier(rdp_epsilon_of, 1.0, rtol=1.0)


# PrivacyLedger ----------------------------------------------------------------------------------


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
