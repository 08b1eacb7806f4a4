"""``dpppl.sample_posterior_predictive``: draws and predictions, never the data."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import dpppl
from dpppl.testing.leaks import find_leaks
from dpppl.testing.models import gamma_exponential, linear_regression

#: A quick naive NA-DPVI fit: the posterior's quality does not matter here.
QUICK = {"steps": 200, "posterior": "naive", "draws": 50, "chains": 2}


def fit(model):
    return dpppl.sample(
        model, mechanism="na-dpvi", epsilon=1.0, delta=1e-5, random_seed=0, progressbar=False,
        **QUICK,
    )


@pytest.fixture(scope="module")
def regression():
    """A linear regression on a private covariate X (pm.Data) and its private result."""
    model = linear_regression(np.random.default_rng(2))
    return model, fit(model), {name: v.value() for name, v in _records(model).items()}


def _records(model):
    from dpppl.model.record_structure import find_records

    return {v.name: v for v in find_records(model).variables}


def test_draws_without_covariates_come_without_the_data_and_without_record_labels():
    model = gamma_exponential(np.random.default_rng(1))
    with model:
        # Labels of the records can come from the data (a DataFrame index): not public.
        model.set_dim("obs", 40, coord_values=[f"patient {i}" for i in range(40)])
        result = fit(model)
        draws = dpppl.sample_posterior_predictive(result, random_seed=0, progressbar=False)
    assert set(draws.children) == {"posterior_predictive"}
    y = draws.posterior_predictive["y"]
    assert y.dims == ("chain", "draw", "obs") and y.shape == (2, 50, 40)
    assert list(y["obs"].values) == list(range(40))
    data = {"y": model.rvs_to_values[model["y"]].data}
    assert find_leaks(draws, data, netcdf=draws.to_netcdf()) == []


def test_draws_at_the_records_own_covariates_are_refused(regression):
    model, result, _ = regression
    with model, pytest.raises(dpppl.PrivateDataError, match=r"records' own data \['X'\]"):
        dpppl.sample_posterior_predictive(result)


def test_predictions_at_public_covariates_set_with_set_data(regression):
    model, result, private = regression
    new_x = np.linspace(-2, 2, 7)
    with model:
        pm.set_data({"X": new_x}, coords={"obs": [f"x = {x:g}" for x in new_x]})
        try:
            predicted = dpppl.sample_posterior_predictive(
                result, predictions=True, random_seed=0, progressbar=False
            )
        finally:
            pm.set_data({"X": private["X"]}, coords={"obs": range(len(private["X"]))})
    assert set(predicted.children) == {"predictions"}
    y = predicted.predictions["y"]
    assert y.shape == (2, 50, 7) and y["obs"].values[0] == "x = -2"
    # The mean prediction follows the posterior's line at the new covariates.
    post = result.posterior
    line = (post["intercept"] + post["slope"] * predicted.predictions["obs"].copy(data=new_x)).mean(
        ("chain", "draw")
    )
    error = y.std(("chain", "draw")) / np.sqrt(y.sizes["chain"] * y.sizes["draw"])
    assert (abs(y.mean(("chain", "draw")) - line) < 4 * error).all()
    assert find_leaks(predicted, private, netcdf=predicted.to_netcdf()) == []


def test_a_check_at_the_private_covariates_must_be_asked_for_and_is_marked(regression):
    model, result, _ = regression
    with model:
        draws = dpppl.sample_posterior_predictive(
            result, use_private_covariates=True, random_seed=0, progressbar=False
        )
    assert set(draws.children) == {"posterior_predictive"}
    assert draws.posterior_predictive.attrs["privacy_note"].startswith("NOT PRIVATE")


def test_extending_the_result_in_place_is_refused(regression):
    model, result, _ = regression
    groups = set(result.children)
    with model, pytest.raises(dpppl.PrivateDataError, match="extend_inferencedata"):
        dpppl.sample_posterior_predictive(result, extend_inferencedata=True)
    assert set(result.children) == groups


def test_a_deterministic_that_reads_the_observed_data_is_refused():
    rng = np.random.default_rng(3)
    with pm.Model(coords={"obs": range(40)}) as model:
        y_data = pm.Data("y_data", rng.normal(size=40), dims="obs")
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("y", mu, 1, observed=y_data, dims="obs")
        pm.Deterministic("residual", y_data - mu, dims="obs")
        result = fit(model)
        with pytest.raises(dpppl.PrivateDataError, match="y_data"):
            dpppl.sample_posterior_predictive(result, var_names=["residual"])
        draws = dpppl.sample_posterior_predictive(result, var_names=["y"], progressbar=False)
    assert list(draws.posterior_predictive.data_vars) == ["y"]
