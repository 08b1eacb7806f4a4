"""The demo's comparison: the naive posterior of the same release, the non-private NUTS posterior,
and how many intervals hold the non-private mean; and the demo's model is one NA-DPVI is
calibrated on."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import dpppl
from dpppl.app.demo import (
    coverage_of,
    naive_posterior,
    non_private_posterior,
)
from dpppl.testing import model_classes
from dpppl.testing.models import gamma_exponential

#: A quick noise-aware NA-DPVI fit (Laplace's post-processing compiles faster than NUTS).
QUICK = {"steps": 400, "inference": "laplace", "draws": 300, "chains": 2, "mc_draws": 2}


@pytest.fixture(scope="module")
def model():
    return gamma_exponential(np.random.default_rng(0))


def fit(model, **options):
    return dpppl.sample(
        model, mechanism="na-dpvi", epsilon=1.0, delta=1e-5, random_seed=5, progressbar=False,
        **{**QUICK, **options},
    )


def test_the_naive_posterior_is_what_na_dpvi_returns_as_naive_for_the_same_release(model):
    noise_aware = fit(model)
    naive = naive_posterior(noise_aware, model, random_seed=1)
    reference = fit(model, posterior="naive")
    # The same seed gives the same DP-SGD release; the naive posterior reads its last iterate.
    xr.testing.assert_equal(noise_aware["dpvi_trace"].to_dataset(), reference["dpvi_trace"].to_dataset())
    assert set(naive.children) == {"posterior"}
    ours, theirs = naive.posterior["rate"].values, reference.posterior["rate"].values
    assert ours.shape == theirs.shape == (2, 300)
    standard_error = theirs.std() * np.sqrt(2 / theirs.size)
    assert abs(ours.mean() - theirs.mean()) < 4 * standard_error
    assert ours.std() == pytest.approx(theirs.std(), rel=0.15)


def test_the_non_private_posterior_holds_nothing_but_the_posterior_and_says_so(model):
    tree = non_private_posterior(
        model, draws=200, tune=200, chains=1, random_seed=0, progressbar=False
    )
    assert set(tree.children) == {"posterior"}
    assert list(tree.posterior.data_vars) == ["rate"]
    assert tree.posterior.attrs["privacy_note"].startswith("NOT PRIVATE")


def posterior(draws: np.ndarray) -> xr.DataTree:
    return xr.DataTree.from_dict(
        {"posterior": xr.Dataset({"theta": (("chain", "draw", "k"), draws)})}
    )


def test_coverage_counts_the_intervals_that_hold_the_reference_mean():
    z = np.random.default_rng(0).normal(size=(2, 500, 3))
    centre = z.mean(axis=(0, 1))
    posteriors = {
        "reference": posterior(z),
        "wide": posterior(3 * z + [0.5, -0.5, 1.0]),
        "narrow, one on the mean": posterior(0.01 * z + centre + [0.0, 2.0, 2.0]),
    }
    assert coverage_of(posteriors, "reference") == {
        "wide": (3, 3), "narrow, one on the mean": (1, 3),
    }


def test_na_dpvi_is_calibrated_on_the_demos_model():
    # The same CI-size TARP study as each model class in the NA-DPVI plugin's
    # test_coverage.py (K = 40, 3000 steps, ε = 1): a calibrated posterior's
    # joint RMSE is 0.058 ± 0.024 there, and 0.106 is two standard deviations above.  The
    # bundled Adult sample is public, so its features serve as the study's covariates.
    demo = model_classes()["demo"]
    study = dpppl.tarp(
        demo.build(),
        mechanism="na-dpvi",
        epsilon=1.0,
        delta=1e-5,
        n_simulations=40,
        covariates=demo.covariates,
        n_workers=1,
        random_seed=20261125,
        progressbar=False,
        steps=3000,
        tune=300,
        draws=500,
        chains=1,
    )
    assert float(study["rmse"].mean()) < 0.106
    # Each marginal too, three standard deviations above the floor (five marginals).
    assert float(study["marginal_rmse"].mean("repeat").max()) < 0.13
