"""The noise-aware posterior is calibrated on one model of each class users fit, at default
settings: GLMs with correlated covariates, a regression with an unknown noise scale, varying
intercepts over public groups.  (The demo's model has its test beside the demo, in
``tests/app/test_demo.py``.)

CI size: N = 1000 records, 3000 DP-SGD steps and K = 40 simulated data sets per class, so each
study runs in about a minute.  At K = 40 a perfectly calibrated posterior's joint TARP RMSE is
0.058 ± 0.024 (``tutorials/RESULTS.md``), so the bound below, two standard deviations above that
floor, catches a posterior that is clearly too wide or too narrow, not a small miscalibration:
the paper-size studies (``-m slow``) do that.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import dpppl

EPSILON, DELTA = 1.0, 1e-5
N_RECORDS = 1000
CORRELATION = np.array([[1.0, 0.6, 0.3], [0.6, 1.0, 0.5], [0.3, 0.5, 1.0]])
#: Joint TARP RMSE at K = 40 two standard deviations above a calibrated posterior's.
FAST_BOUND = 0.106
FAST = {"steps": 3000, "tune": 300, "draws": 500, "chains": 1}


def correlated_covariates(rng: np.random.Generator, n_records: int = N_RECORDS) -> dict:
    return {"X": rng.multivariate_normal(np.zeros(3), CORRELATION, n_records)}


def grouped_covariates(rng: np.random.Generator, n_records: int = N_RECORDS) -> dict:
    return {"x": rng.standard_normal(n_records), "group_index": rng.integers(0, 5, n_records)}


def glm(likelihood: str, n_records: int = N_RECORDS) -> pm.Model:
    X = correlated_covariates(np.random.default_rng(0), n_records)["X"]
    with pm.Model(coords={"feature": range(3)}) as model:
        x = pm.Data("X", X)
        b0 = pm.Normal("b0", 0.0, 1.0)
        w = pm.Normal("w", 0.0, 0.5, dims="feature")
        eta = b0 + x @ w
        # The observations are placeholders: TARP simulates every data set from the model.
        if likelihood == "logistic":
            pm.Bernoulli("y", logit_p=eta, observed=np.zeros(n_records, dtype=int))
        else:
            pm.Poisson("y", mu=pm.math.exp(eta), observed=np.zeros(n_records, dtype=int))
    return model


def unknown_scale_regression(n_records: int = N_RECORDS) -> pm.Model:
    X = correlated_covariates(np.random.default_rng(0), n_records)["X"]
    with pm.Model(coords={"feature": range(3)}) as model:
        x = pm.Data("X", X)
        b0 = pm.Normal("b0", 0.0, 1.0)
        w = pm.Normal("w", 0.0, 1.0, dims="feature")
        s = pm.HalfNormal("s", 1.0)
        pm.Normal("y", b0 + x @ w, s, observed=np.zeros(n_records))
    return model


def varying_intercepts(n_records: int = N_RECORDS) -> pm.Model:
    data = grouped_covariates(np.random.default_rng(0), n_records)
    with pm.Model(coords={"group": range(5)}) as model:
        x = pm.Data("x", data["x"])
        group = pm.Data("group_index", data["group_index"])
        mu_a = pm.Normal("mu_a", 0.0, 1.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        w = pm.Normal("w", 0.0, 1.0)
        s = pm.HalfNormal("s", 1.0)
        pm.Normal("y", mu_a + tau * z[group] + w * x, s, observed=np.zeros(n_records))
    return model


def joint_rmse(model: pm.Model, covariates, n_simulations: int, **options) -> float:
    study = dpppl.tarp(
        model,
        mechanism="na-dpvi",
        epsilon=EPSILON,
        delta=DELTA,
        n_simulations=n_simulations,
        covariates=covariates,
        n_workers=1,
        random_seed=20261125,
        progressbar=False,
        **options,
    )
    return float(study["rmse"].mean())


CLASSES = {
    "logistic regression, correlated covariates": (
        lambda: glm("logistic"), correlated_covariates
    ),
    "Poisson regression, correlated covariates": (lambda: glm("poisson"), correlated_covariates),
    "regression with an unknown noise scale": (unknown_scale_regression, correlated_covariates),
    "varying intercepts over public groups": (varying_intercepts, grouped_covariates),
}


@pytest.mark.parametrize("model_class", CLASSES)
def test_the_noise_aware_posterior_is_calibrated_on_each_model_class(model_class):
    build, covariates = CLASSES[model_class]
    assert joint_rmse(build(), covariates, 40, **FAST) < FAST_BOUND
