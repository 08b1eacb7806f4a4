"""The noise-aware posterior is calibrated where the naive last iterate is not (NA-DPVI paper,
Table 1, Beta–Bernoulli at ε = 0.1), measured by TARP on data simulated from the model."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import dpppl

EPSILON, DELTA = 0.1, 1e-5


def beta_bernoulli(n_records: int) -> pm.Model:
    # The observations are placeholders: TARP simulates every data set from the model.
    with pm.Model() as model:
        p = pm.Beta("p", 1.0, 1.0)
        pm.Bernoulli("y", p=p, observed=np.zeros(n_records, dtype=int))
    return model


def joint_rmse(model: pm.Model, posterior: str, n_simulations: int, **options) -> float:
    study = dpppl.tarp(
        model,
        mechanism="na-dpvi",
        epsilon=EPSILON,
        delta=DELTA,
        n_simulations=n_simulations,
        n_workers=1,
        random_seed=20251122,
        progressbar=False,
        posterior=posterior,
        **options,
    )
    return float(study["rmse"].mean())


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
