"""Hostile and odd inputs: each is refused with a clear dpppl error before any budget is spent (the
ledger is unchanged), or gives a documented result; nothing crashes or hangs.

Models are compiled once per module; hypothesis varies the data through ``pm.set_data`` and the
privacy parameters, with few examples, since every accepted input runs a (tiny) fit.
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import dpppl
from dpppl import (
    InvalidDataError,
    InvalidPrivacyParameterError,
    ModelNotSupportedError,
    PrivacyLedger,
)

N = 20
TINY = {"mechanism": "na-dpvi", "progressbar": False, "steps": 20, "burn_in": 0.0,
        "posterior": "naive", "draws": 10, "chains": 1, "mc_draws": 2}
QUICK = settings(max_examples=8, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(0)
    with pm.Model(coords={"obs": range(N)}) as model:
        X = pm.Data("X", rng.normal(size=N), dims="obs")
        Y = pm.Data("Y", rng.normal(size=N), dims="obs")
        slope = pm.Normal("slope", 0, 5)
        pm.Normal("y", slope * X, 1, observed=Y, dims="obs")
    return model


def sample(model, ledger, **kwargs):
    with model:
        return dpppl.sample(**{"epsilon": 1.0, "delta": 1e-4, "ledger": ledger, **TINY, **kwargs})


def fresh_ledger() -> PrivacyLedger:
    return PrivacyLedger(epsilon=100.0, delta=1e-2)


def assert_refused(error_type, model, match=None, **kwargs):
    ledger = fresh_ledger()
    with pytest.raises(error_type, match=match):
        sample(model, ledger, **kwargs)
    assert ledger.entries == [] and ledger.spent() == 0


# -- privacy parameters ----------------------------------------------------------------------------


def _not_a_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return True
    return False


# Text that parses as a number ("1") is a valid ε or δ, not a hostile one.
not_numbers = st.text(max_size=3).filter(_not_a_number)
bad_epsilons = st.one_of(st.floats(max_value=0.0), st.just(math.inf), st.just(math.nan),
                         st.just(-math.inf), not_numbers, st.none())
bad_deltas = st.one_of(st.floats(min_value=1.0), st.floats(max_value=0.0), st.just(math.nan),
                       not_numbers, st.none())


@QUICK
@given(epsilon=bad_epsilons)
def test_epsilon_at_or_beyond_its_edges_is_refused(regression, epsilon):
    assert_refused(InvalidPrivacyParameterError, regression, "epsilon", epsilon=epsilon)


@QUICK
@given(delta=bad_deltas)
def test_delta_at_or_beyond_its_edges_is_refused(regression, delta):
    assert_refused(InvalidPrivacyParameterError, regression, "delta", delta=delta)


# -- data ------------------------------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@QUICK
@given(
    values=arrays(np.float64, N, elements=finite),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
    where=st.integers(0, N - 1),
    column=st.sampled_from(["X", "Y"]),
)
def test_nan_or_infinite_values_are_refused_without_saying_which_record(
    regression, values, bad, where, column
):
    values = values.copy()
    values[where] = bad
    original = regression[column].get_value()
    try:
        with regression:
            pm.set_data({column: values})
        assert_refused(InvalidDataError, regression, "NaN or infinite")
    finally:
        with regression:
            pm.set_data({column: original})


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=arrays(np.float64, N, elements=st.one_of(
    finite, st.sampled_from([1e300, -1e300, 1e-300, 0.0, 2.0**1023])), unique=False))
def test_extreme_finite_magnitudes_give_a_finite_release(regression, values):
    """Documented: records whose gradient overflows contribute nothing (clip_rows); the fit
    finishes, charges exactly its plan, and releases finite draws."""
    original = regression["Y"].get_value()
    try:
        with regression:
            pm.set_data({"Y": values})
        ledger = fresh_ledger()
        result = sample(regression, ledger)
        assert np.all(np.isfinite(result.posterior["slope"].values))
        assert len(ledger.entries) == 1 and ledger.spent() <= 1.0
    finally:
        with regression:
            pm.set_data({"Y": original})


def test_empty_data_are_refused():
    with pm.Model(coords={"obs": []}) as model:
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu, 1, observed=np.zeros(0), dims="obs")
    assert_refused(InvalidDataError, model, "no records")


def test_one_record_is_a_valid_data_set():
    """Documented: N = 1 is allowed (N is public); the guarantee is the same, the posterior is
    mostly prior."""
    with pm.Model(coords={"obs": [0]}) as model:
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu, 1, observed=np.array([0.5]), dims="obs")
    ledger = fresh_ledger()
    result = sample(model, ledger)
    assert result.attrs["dp_n_records"] == 1
    assert len(ledger.entries) == 1


@pytest.mark.parametrize("values", [
    np.array(["a", "b"] * (N // 2)),
    np.array([b"x"] * N),
    np.array([None] * N, dtype=object),
    np.array([{"v": 1}] * N, dtype=object),
])
def test_record_arrays_of_a_wrong_dtype_are_refused(regression, values):
    model = dpppl.record_model(regression)
    data = {**model.data(), "X": values}
    with pytest.raises(InvalidDataError, match="numeric"):
        model.check_data(data)


def test_a_string_outcome_is_refused_before_any_budget_is_spent():
    """PyMC itself cannot build the model: the refusal comes before dpppl is reached."""
    with pytest.raises((TypeError, ValueError)):
        with pm.Model(coords={"obs": range(N)}):
            mu = pm.Normal("mu", 0, 1)
            pm.Normal("y", mu, 1, observed=np.array(["x"] * N), dims="obs")


# -- models ----------------------------------------------------------------------------------------


def test_discrete_latent_variables_are_refused():
    with pm.Model(coords={"obs": range(N)}) as model:
        k = pm.Poisson("k", 3)
        pm.Normal("y", k, 1, observed=np.zeros(N), dims="obs")
    assert_refused(ModelNotSupportedError, model, "discrete")


def test_per_record_latent_variables_are_refused():
    with pm.Model(coords={"obs": range(N)}) as model:
        z = pm.Normal("z", 0, 1, dims="obs")
        pm.Normal("y", z, 1, observed=np.zeros(N), dims="obs")
    assert_refused(ModelNotSupportedError, model, "record dimension")


def test_a_model_without_observed_data_is_refused():
    with pm.Model() as model:
        pm.Normal("mu", 0, 1)
    assert_refused(ModelNotSupportedError, model, "no observed variable")


def test_missing_values_that_pymc_would_impute_are_refused():
    with pm.Model(coords={"obs": range(N)}) as model:
        mu = pm.Normal("mu", 0, 1)
        y = np.zeros(N)
        y[2] = np.nan
        pm.Normal("y", mu, 1, observed=y, dims="obs")
    assert_refused(InvalidDataError, model, "missing values")


def test_a_data_dependent_prior_is_refused(regression):
    rng = np.random.default_rng(1)
    with pm.Model(coords={"obs": range(N)}) as model:
        X = pm.Data("X", rng.normal(size=N), dims="obs")
        mu = pm.Normal("mu", X.mean(), 1)
        pm.Normal("y", mu * X, 1, observed=rng.normal(size=N), dims="obs")
    assert_refused(ModelNotSupportedError, model, "depends on the record data")


# -- too little for the requested guarantee --------------------------------------------------------


# δ ≥ 1/N warns (a PrivacyWarning) and is honoured: tests/test_sampling.py checks it.


def test_too_few_steps_for_the_noise_model_are_refused_before_any_budget_is_spent(regression):
    assert_refused(ValueError, regression, "at least 10 steps", steps=5)


def test_a_tiny_epsilon_is_met_by_more_noise_never_by_overshooting(regression):
    epsilon = 1e-3
    ledger = fresh_ledger()
    result = sample(regression, ledger, epsilon=epsilon)
    assert 0 < result.attrs["dp_epsilon"] <= epsilon
    assert result.attrs["dp_noise_multiplier"] > 1


@pytest.mark.parametrize("epsilon", [1e3, 1e300])
def test_an_epsilon_too_large_to_account_is_refused_with_the_reason(regression, epsilon):
    # (1 + e^ε)·η, what a truncated batch costs in δ, overflows a float above ε ≈ 709: the
    # refusal names it instead of an OverflowError escaping from the arithmetic.
    with pytest.raises(InvalidPrivacyParameterError, match="does not cover"):
        sample(regression, None, epsilon=epsilon)
