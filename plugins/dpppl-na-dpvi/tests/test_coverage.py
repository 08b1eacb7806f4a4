"""The noise-aware posterior is calibrated where the naive last iterate is not (NA-DPVI paper,
Table 1, Beta–Bernoulli at ε = 0.1), and on one model of each class users fit, measured by TARP
on data simulated from the model."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import dpppl
from dpppl.testing import model_classes

EPSILON, DELTA = 0.1, 1e-5


def beta_bernoulli(n_records: int) -> pm.Model:
    # The observations are placeholders: TARP simulates every data set from the model.
    with pm.Model() as model:
        p = pm.Beta("p", 1.0, 1.0)
        pm.Bernoulli("y", p=p, observed=np.zeros(n_records, dtype=int))
    return model


def tarp_study(
    model: pm.Model,
    posterior: str,
    n_simulations: int,
    *,
    epsilon: float = EPSILON,
    covariates=None,
    random_seed: int = 20251122,
    n_workers: int = 1,
    **options,
):
    return dpppl.tarp(
        model,
        mechanism="na-dpvi",
        epsilon=epsilon,
        delta=DELTA,
        n_simulations=n_simulations,
        covariates=covariates,
        n_workers=n_workers,
        random_seed=random_seed,
        progressbar=False,
        posterior=posterior,
        **options,
    )


def joint_rmse(model: pm.Model, posterior: str, n_simulations: int, **options) -> float:
    return float(tarp_study(model, posterior, n_simulations, **options)["rmse"].mean())


def test_small_study_separates_the_noise_aware_from_the_naive_posterior():
    # CI size: fewer records, steps and draws than the paper, so the bounds are loose.  With
    # 40 simulations a calibrated posterior's RMSE is about 0.05 from Monte Carlo error alone.
    model = beta_bernoulli(1000)
    fast = {"steps": 2000, "tune": 300, "draws": 500, "chains": 1}
    noise_aware = joint_rmse(model, "noise-aware", 40, **fast)
    naive = joint_rmse(model, "naive", 40, **fast)
    assert noise_aware < 0.12
    assert naive > 0.18
    assert naive > 2 * noise_aware


@pytest.mark.slow
def test_paper_size_noise_aware_coverage_error_is_within_the_papers_range():
    # N = 5000, κ = 0.1, T = 10⁴ and NUTS with 1000 warm-up and 4000 draws (the defaults).
    model = beta_bernoulli(5000)
    assert joint_rmse(model, "noise-aware", 200) <= 0.03
    assert joint_rmse(model, "naive", 200) >= 0.2


# One model of each class users fit, at default settings: GLMs with correlated covariates, a
# regression with an unknown noise scale, varying intercepts over public groups, non-centred and
# centred (the demo's model has its test beside the demo, in tests/app/test_demo.py).  CI size:
# N = 1000 records, 3000 DP-SGD steps and K = 40 simulated data sets at ε = 1, about a minute
# per class.  At K = 40 a perfectly calibrated posterior's joint TARP RMSE is 0.058 ± 0.024
# (tutorials/RESULTS.md), so the bound, two standard deviations above that floor, catches a
# posterior that is clearly too wide or too narrow, not a small miscalibration: the paper-size
# studies (-m slow) do that.

#: Joint TARP RMSE at K = 40 two standard deviations above a calibrated posterior's.
FAST_BOUND = 0.106
FAST_CLASS_STUDY = {"steps": 3000, "tune": 300, "draws": 500, "chains": 1}
#: The classes this file checks; the demo's model has its test beside the demo.
CLASSES = [name for name in model_classes() if name != "demo"]

#: Marginal TARP RMSE at K = 40 three standard deviations above a calibrated posterior's: a
#: looser bound than the joint one, because each class has four to nine marginals.
FAST_MARGINAL_BOUND = 0.13
#: Classes known to miss a bound, and why (tutorials/RESULTS.md, stops 43, 44, 47 and 50).
KNOWN_FAILURES = {
    "varying_intercepts": (
        "written non-centred (mu_a + tau * z) the group mean, scale and offsets are "
        "over-confident under either post-processing.  The records read mu_a, tau and z only "
        "through the intercepts mu_a + tau * z (RecordModel.record_parameter_rank, 7 of 9), so "
        "by default (stop 52) the optimum model reads the release: 0.071 at K = 200 (stop 49; "
        "90 % intervals 0.69-0.76), mean-field q's own failure, over-confident even without "
        "privacy noise (epsilon = 30: 17-25 %).  The likelihood model, whose quadratic "
        "log-likelihood has a constant curvature that the products tau * z do not have, is "
        "worse (postprocessing='likelihood', K = 40: 0.256).  Written centred (the next class) "
        "the same model is calibrated"
    ),
}


@pytest.mark.parametrize("model_class", CLASSES)
def test_the_noise_aware_posterior_is_calibrated_on_each_model_class(model_class):
    if model_class in KNOWN_FAILURES:
        # Not run: the class study at 10,000 steps measures the failure plainly (K = 200:
        # 0.071, tutorials/RESULTS.md, stop 49); the suite does not repeat it at CI size.
        pytest.xfail(KNOWN_FAILURES[model_class])
    chosen = model_classes()[model_class]
    study = tarp_study(
        chosen.build(), "noise-aware", 40, epsilon=1.0, covariates=chosen.covariates,
        random_seed=20261125, **FAST_CLASS_STUDY,
    )
    joint = float(study["rmse"].mean())
    marginals = study["marginal_rmse"].mean("repeat")
    largest = float(marginals.max())
    assert joint < FAST_BOUND
    assert largest < FAST_MARGINAL_BOUND, (
        f"{marginals.idxmax('parameter').item()}: marginal TARP RMSE {largest:.3f}"
    )


#: At K = 200 a calibrated posterior's joint TARP RMSE is 0.026 ± 0.011: two and three
#: standard deviations above it, for the joint and for each marginal.
PAPER_SIZE_BOUND, PAPER_SIZE_MARGINAL_BOUND = 0.048, 0.059


@pytest.mark.slow
@pytest.mark.parametrize("model_class", [c for c in model_classes() if c not in KNOWN_FAILURES])
def test_paper_size_class_study_is_calibrated(model_class):
    # The K = 200 studies of tutorials/RESULTS.md (tutorials/model_classes.py), 3-6 minutes
    # each on two workers.
    chosen = model_classes()[model_class]
    study = tarp_study(
        chosen.build(), "noise-aware", 200, epsilon=1.0, covariates=chosen.covariates,
        random_seed=20261127, n_workers=2, steps=10_000, tune=300, draws=500, chains=1,
    )
    marginals = study["marginal_rmse"].mean("repeat")
    assert float(study["rmse"].mean()) < PAPER_SIZE_BOUND
    assert float(marginals.max()) < PAPER_SIZE_MARGINAL_BOUND, (
        f"{marginals.idxmax('parameter').item()}: marginal TARP RMSE {float(marginals.max()):.3f}"
    )
