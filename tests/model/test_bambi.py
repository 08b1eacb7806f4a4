"""Bambi models go through dpppl as PyMC models do: formulas with a categorical predictor, for a
Gaussian, a Bernoulli and a Poisson response; Bambi's data-scaled priors are refused."""

from __future__ import annotations

import bambi as bmb
import numpy as np
import pandas as pd
import pytest

import dpppl
from dpppl.testing.leaks import find_leaks

N = 300
#: A quick naive NA-DPVI fit: these tests are about the model plumbing, not the posterior.
QUICK = {"steps": 300, "posterior": "naive", "draws": 100, "chains": 2}


def frame(response) -> pd.DataFrame:
    """x ~ N(0, 1) and a three-level group (every level present), and the response drawn
    from the linear predictor 0.5 + x + effect of the group."""
    rng = np.random.default_rng(0)
    data = pd.DataFrame(
        {
            "x": rng.normal(size=N),
            "group": pd.Categorical(rng.choice(["a", "b", "c"], N), categories=["a", "b", "c"]),
        }
    )
    eta = 0.5 + data["x"] + data["group"].map({"a": 0.0, "b": 0.5, "c": -0.5}).astype(float)
    data["y"] = response(rng, eta.to_numpy())
    return data


FAMILIES = {
    "gaussian": lambda rng, eta: eta + rng.normal(size=N),
    "bernoulli": lambda rng, eta: rng.binomial(1, 1 / (1 + np.exp(-eta))),
    "poisson": lambda rng, eta: rng.poisson(np.exp(eta)),
}

#: Priors chosen without the data, as a private analysis needs them.
PRIORS = {
    "Intercept": bmb.Prior("Normal", mu=0, sigma=2.5),
    "x": bmb.Prior("Normal", mu=0, sigma=1),
    "group": bmb.Prior("Normal", mu=0, sigma=1),
    "sigma": bmb.Prior("HalfNormal", sigma=2),
}


def bambi_model(family: str) -> bmb.Model:
    priors = PRIORS if family == "gaussian" else {k: v for k, v in PRIORS.items() if k != "sigma"}
    return bmb.Model(
        "y ~ x + group", frame(FAMILIES[family]), family=family, priors=priors, auto_scale=False
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_bambi_formula_is_fitted_privately_with_its_names_and_levels(family):
    model = bambi_model(family)
    result = dpppl.sample(
        model, mechanism="na-dpvi", epsilon=1.0, delta=1e-5, random_seed=0, progressbar=False,
        **QUICK,
    )
    expected = {"Intercept", "x", "group"} | ({"sigma"} if family == "gaussian" else set())
    assert set(result.posterior.data_vars) == expected
    # The reference level "a" is absorbed in the intercept, as Bambi codes it.
    assert list(result.posterior["group"].coords["group_dim"].values) == ["b", "c"]
    assert result.attrs["dp_n_records"] == N and result.attrs["dp_epsilon"] <= 1.0
    # Bambi's per-record linear predictor stays out, and no data value is anywhere.
    assert not {"mu", "p"} & set(result.posterior.data_vars)
    data = {name: model.data[name].to_numpy(dtype=float) for name in ("x", "y")}
    assert find_leaks(result, data, netcdf=result.to_netcdf()) == []


def test_bambis_data_scaled_priors_are_refused_before_anything_runs():
    scaled = bmb.Model("y ~ x + group", frame(FAMILIES["gaussian"]))
    ledger = dpppl.PrivacyLedger(epsilon=5.0, delta=1e-5)
    with pytest.raises(dpppl.ModelNotSupportedError, match="auto_scale=False"):
        dpppl.sample(scaled, mechanism="na-dpvi", epsilon=1.0, delta=1e-5, ledger=ledger)
    assert ledger.entries == []


def test_bambi_predicts_at_new_public_data_from_a_private_result_left_as_it_was():
    model = bambi_model("bernoulli")
    result = dpppl.sample(
        model, mechanism="na-dpvi", epsilon=1.0, delta=1e-5, random_seed=0, progressbar=False,
        **QUICK,
    )
    groups = {node.path: set(node.dataset.data_vars) for node in result.subtree}
    new = pd.DataFrame(
        {"x": [-1.0, 0.0, 1.0], "group": pd.Categorical(["a", "b", "c"], categories=["a", "b", "c"])}
    )
    predicted = model.predict(result, kind="response", data=new, inplace=False, random_seed=0)
    assert predicted.posterior_predictive["y"].shape == (2, 100, 3)
    assert {node.path: set(node.dataset.data_vars) for node in result.subtree} == groups
    # At the model's own data the draws would read the private covariates: dpppl refuses them.
    with pytest.raises(dpppl.PrivateDataError, match="fixed in the model"):
        dpppl.sample_posterior_predictive(result, model=model, predictions=True)
