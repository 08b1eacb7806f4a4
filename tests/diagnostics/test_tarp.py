"""TARP coverage: calibration of an exact posterior, detection of miscalibration, agreement with
the ``tarp`` package, randomness hygiene and netCDF round trips.

Bands used below.  For an exact posterior, θ_k and the S draws are exchangeable given the release,
so S·f_k is uniform on {0, …, S} and the coverage curve C(α) is the empirical CDF of f at 1 − α,
off the diagonal by at most 1/(S + 1) in expectation.  Hence
- the largest deviation of one curve from the diagonal is at most the Kolmogorov–Smirnov 1 %
  critical value 1.63/√K plus 1/(S + 1) with probability 0.99, and the RMSE is never above the
  largest deviation (``ks_bound``); a curve averaged over repeats deviates less than the worst
  repeat;
- at a single α, K·C(α) is binomial(K, 1 − α), so |C(α) − (1 − α)| ≤ 4·√(α(1 − α)/K) + 1/(S + 1)
  fails with probability below 1e-4 (``binomial_band``).
A miscalibrated posterior is "detected" when its RMSE exceeds ``ks_bound`` (a value a calibrated
posterior reaches with probability under 1 %) and its curve leaves ``binomial_band`` on the side
the theory in ``dpppl.diagnostics.tarp`` predicts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from dpppl.diagnostics.tarp import (
    DEFAULT_ALPHA,
    coverage_summary,
    reference_points,
    tarp_coverage,
)
from dpppl.errors import InvalidDataError


def ks_bound(n_sims: int, n_draws: int) -> float:
    return 1.63 / np.sqrt(n_sims) + 1 / (n_draws + 1)


def binomial_band(alpha: float, n_sims: int, n_draws: int) -> float:
    return 4 * np.sqrt(alpha * (1 - alpha) / n_sims) + 1 / (n_draws + 1)


def test_default_grid_is_the_authors():
    expected = [0.001] + [round(0.05 * i, 2) for i in range(1, 20)] + [0.999]
    np.testing.assert_allclose(DEFAULT_ALPHA, expected)
    assert not DEFAULT_ALPHA.flags.writeable


@pytest.mark.parametrize(
    ("references", "metric"),
    [
        ("posterior_uniform", "euclidean"),
        ("prior", "euclidean"),
        ("posterior_uniform", "manhattan"),
    ],
)
def test_exact_posterior_is_calibrated(conjugate, references, metric):
    n_sims, n_draws, _ = conjugate.noise.shape
    tarp = tarp_coverage(
        conjugate.samples(), conjugate.truth, references=references, metric=metric, random_seed=1
    )
    bound = ks_bound(n_sims, n_draws)
    assert float(tarp["rmse"].mean()) < bound
    assert float(abs(tarp["coverage_error"].mean("repeat")).max()) < bound
    assert (tarp["marginal_rmse"].mean("repeat") < bound).all()
    assert float(abs(tarp["marginal_coverage_error"].mean("repeat")).max()) < bound
    # f_k is uniform on [0, 1]: its mean is 1/2 within a few standard errors √(1/12K).
    assert abs(float(tarp["ball_mass"].mean()) - 0.5) < 4 * np.sqrt(1 / 12 / n_sims)


# side = −1: the truth falls outside high-credibility balls too often (C below 1 − α at
# α = 0.1, curve below the diagonal on average); side = +1: too often inside.
MISCALIBRATED = {
    "over-confident": ({"scale": 0.5}, -1),
    "over-dispersed": ({"scale": 2.0}, +1),
    "biased": ({"bias": 1.0}, -1),
}


@pytest.mark.parametrize("case", list(MISCALIBRATED))
def test_miscalibrated_posterior_is_detected(conjugate, case):
    distortion, side = MISCALIBRATED[case]
    n_sims, n_draws, _ = conjugate.noise.shape
    exact = tarp_coverage(conjugate.samples(), conjugate.truth, random_seed=1)
    tarp = tarp_coverage(conjugate.samples(**distortion), conjugate.truth, random_seed=1)
    print(
        f"{case}: RMSE {float(tarp['rmse'].mean()):.4f} vs exact {float(exact['rmse'].mean()):.4f}"
    )

    assert float(tarp["rmse"].mean()) > ks_bound(n_sims, n_draws)
    assert float(tarp["rmse"].mean()) > 3 * float(exact["rmse"].mean())

    error = tarp["coverage_error"].mean("repeat")
    band = binomial_band(0.1, n_sims, n_draws)
    assert side * float(error.sel(alpha=0.1)) > band
    assert side * float(error.mean()) > 0
    marginal = tarp["marginal_coverage_error"].mean("repeat").sel(alpha=0.1)
    assert (side * marginal > band).all()
    assert (tarp["marginal_rmse"].mean("repeat") > 3 * exact["marginal_rmse"].mean("repeat")).all()


def test_central_intervals_of_an_exact_posterior_hold_the_truth_at_their_level(conjugate):
    n_sims, n_draws, _ = conjugate.noise.shape
    tarp = tarp_coverage(conjugate.samples(), conjugate.truth, random_seed=1)
    # K·coverage is binomial(K, 1 − α) at each level, up to the 1/S of the draws' grid.
    error = tarp["interval_coverage"] - tarp["credibility"]
    bands = xr.DataArray(
        [binomial_band(a, n_sims, n_draws) for a in DEFAULT_ALPHA], coords={"alpha": DEFAULT_ALPHA}
    )
    assert (abs(error) < bands).all()
    assert (tarp["interval_rmse"] < ks_bound(n_sims, n_draws)).all()
    # The ranks are uniform: mean 1/2 within four standard errors √(1/12K) per parameter.
    assert (abs(tarp["marginal_rank"].mean("simulation") - 0.5) < 4 * np.sqrt(1 / 12 / n_sims)).all()


def test_central_intervals_see_a_heavy_tailed_over_dispersed_posterior(conjugate):
    # Draws from a Student t with 2 degrees of freedom around the exact mean, scaled so that
    # half the draws lie within the exact posterior's 0.67 sd: the central 50 % interval is about
    # as wide as the exact one, the 90 % interval about 2.2 times as wide.  TARP with references
    # near the posterior reads this as nearly calibrated (its f_k is about 1/2 whatever the
    # tails); the 90 % intervals hold the truth nearly always.
    n_sims, n_draws, n_params = conjugate.noise.shape
    rng = np.random.default_rng(5)
    t = rng.standard_t(2, size=(n_sims, n_draws, n_params)) * (0.674 / 0.816)
    samples = conjugate.post_mean[:, np.newaxis, :] + conjugate.post_sd * t
    tarp = tarp_coverage(samples, conjugate.truth, random_seed=1)
    assert (tarp["marginal_rmse"].mean("repeat") < ks_bound(n_sims, n_draws)).all()
    held = tarp["interval_coverage"]
    assert (abs(held.sel(alpha=0.5) - 0.5) < binomial_band(0.5, n_sims, n_draws)).all()
    assert (held.sel(alpha=0.1) > 0.9 + binomial_band(0.1, n_sims, n_draws)).all()


def test_ranks_count_ties_half():
    draws = np.array([[[0.0], [1.0], [1.0], [2.0]]])
    tarp = tarp_coverage(draws, np.array([[1.0]]), n_repeats=1, random_seed=0)
    assert float(tarp["marginal_rank"].squeeze()) == (1 + 0.5 * 2) / 4
    # A truth at the median lies inside every central interval that has positive width.
    assert (tarp["interval_coverage"].sel(alpha=tarp["alpha"] < 0.999) == 1).all()


def test_one_dimension_marginal_equals_joint(make_conjugate):
    draws = make_conjugate(80, 300, 1, seed=3)
    for metric in ("euclidean", "manhattan"):
        tarp = tarp_coverage(draws.samples(), draws.truth, metric=metric, random_seed=0)
        np.testing.assert_array_equal(
            tarp["marginal_ball_mass"].isel(parameter=0), tarp["ball_mass"]
        )
        np.testing.assert_array_equal(tarp["marginal_ecp"].isel(parameter=0), tarp["ecp"])


def _tarp_package(samples, truth, references, metric):
    """tarp 0.1.1's coverage on copies of the inputs, leaving numpy's global RNG as it was."""
    tarp = pytest.importorskip("tarp")
    state = np.random.get_state()
    try:
        return tarp.get_tarp_coverage(
            np.array(samples.transpose(1, 0, 2)),
            truth.copy(),
            references=references.copy(),
            metric=metric,
            num_alpha_bins=20,
            norm=False,
            bootstrap=False,
        )
    finally:
        np.random.set_state(state)


@pytest.mark.parametrize("metric", ["euclidean", "manhattan"])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_agrees_with_tarp_package(make_conjugate, metric, scale):
    # S = 997 is prime, so no f_k = j/997 lies within 5e-5 of tarp's bin edges k/20: the two
    # implementations cannot disagree through rounding at a tie.
    draws = make_conjugate(200, 997, 3, seed=11)
    samples = draws.samples(scale=scale)
    truth = draws.truth.copy()
    rng = np.random.default_rng(5)
    refs = samples.mean(axis=1) + rng.uniform(-4, 4, truth.shape) * samples.std(axis=1)
    # tarp 0.1.1 spreads its bins from min f to max f, not over [0, 1]; two anchor simulations
    # pin them to [0, 1]: one whose truth is its reference (f = 0), one far from every draw (f = 1).
    truth[0] = refs[0]
    truth[1] = refs[1] + 1e3

    ours = tarp_coverage(samples, truth, references=refs, metric=metric)
    credibility = 1 - ours["alpha"].values
    joint_ecp, edges = _tarp_package(samples, truth, refs, metric)
    np.testing.assert_allclose(edges, np.linspace(0, 1, 21))
    # tarp's ecp[j] is the fraction of f below edge j, i.e. C(α) at 1 − α = edge j; at edge 20
    # (α = 0) it counts f = 1 too, so only the interior edges compare.
    checked = 0
    for j in range(1, 20):
        match = np.isclose(credibility, edges[j], atol=1e-9)
        if match.any():
            np.testing.assert_allclose(ours["ecp"].isel(repeat=0)[match], joint_ecp[j], atol=1e-9)
            for p in range(3):
                marginal_ecp, _ = _tarp_package(
                    samples[..., [p]], truth[:, [p]], refs[:, [p]], metric
                )
                np.testing.assert_allclose(
                    ours["marginal_ecp"].isel(repeat=0, parameter=p)[match],
                    marginal_ecp[j],
                    atol=1e-9,
                )
            checked += 1
    assert checked == 19  # α = 0.05, …, 0.95 of the default grid


def test_randomness_is_local_and_inputs_are_not_written(small_conjugate):
    samples = small_conjugate.samples()
    truth = small_conjugate.truth.copy()
    samples.flags.writeable = False
    truth.flags.writeable = False
    before = np.random.get_state()

    first = tarp_coverage(samples, truth, random_seed=42)
    again = tarp_coverage(samples, truth, random_seed=np.random.default_rng(42))
    other = tarp_coverage(samples, truth, random_seed=43)

    after = np.random.get_state()
    assert before[0] == after[0] and np.array_equal(before[1], after[1]) and before[2:] == after[2:]
    np.testing.assert_array_equal(first["ball_mass"], again["ball_mass"])
    assert not np.array_equal(first["ball_mass"], other["ball_mass"])
    assert json.loads(first.attrs["random_seed"]) == 42
    assert json.loads(again.attrs["rng_state"]) == json.loads(first.attrs["rng_state"])


def test_user_references_set_the_repeats(small_conjugate):
    samples, truth = small_conjugate.samples(), small_conjugate.truth
    refs = np.stack([truth + 0.1, truth - 0.1])
    one = tarp_coverage(samples, truth, references=refs[0])
    two = tarp_coverage(samples, truth, references=refs)
    assert one.sizes["repeat"] == 1 and two.sizes["repeat"] == 2
    assert two.attrs["reference_rule"] == "user"
    np.testing.assert_array_equal(two["ball_mass"].isel(repeat=0), one["ball_mass"].isel(repeat=0))
    with pytest.raises(ValueError, match="n_repeats"):
        tarp_coverage(samples, truth, references=refs, n_repeats=3)
    with pytest.raises(ValueError, match="references must have shape"):
        tarp_coverage(samples, truth, references=refs[:, :-1])


def test_prior_rule_pairs_every_simulation_with_another(small_conjugate):
    truth = small_conjugate.truth
    zeros = np.zeros_like(truth)
    refs, rule = reference_points("prior", zeros, zeros, truth, 5, 4.0, np.random.default_rng(0))
    assert rule == "prior" and refs.shape == (5, *truth.shape)
    for repeat in refs:
        assert not np.any(np.all(repeat == truth, axis=1))
        np.testing.assert_array_equal(np.sort(repeat, axis=0), np.sort(truth, axis=0))


def test_posterior_uniform_rule_stays_in_its_box(small_conjugate):
    samples = small_conjugate.samples()
    mean, sd = samples.mean(axis=1), samples.std(axis=1)
    refs, _ = reference_points(
        "posterior_uniform", mean, sd, small_conjugate.truth, 20, 4.0, np.random.default_rng(0)
    )
    offset = (refs - mean) / sd
    assert np.all(np.abs(offset) <= 4) and offset.max() > 3.5 and offset.min() < -3.5


def test_invalid_inputs_are_refused(small_conjugate):
    samples, truth = small_conjugate.samples(), small_conjugate.truth
    with pytest.raises(InvalidDataError, match="samples must have shape"):
        tarp_coverage(samples[0], truth)
    with pytest.raises(InvalidDataError, match="truth must have shape"):
        tarp_coverage(samples, truth[:, :2])
    bad = samples.copy()
    bad[3, 4, 1] = np.nan
    with pytest.raises(InvalidDataError, match=r"non-finite values: simulation\(s\) 3 \(1 of"):
        tarp_coverage(bad, truth)
    with pytest.raises(ValueError, match="alpha"):
        tarp_coverage(samples, truth, alpha=[0.5, 0.2])
    with pytest.raises(ValueError, match="alpha"):
        tarp_coverage(samples, truth, alpha=[0.5, 1.2])
    with pytest.raises(ValueError, match="metric"):
        tarp_coverage(samples, truth, metric="cosine")
    with pytest.raises(ValueError, match="references must be one of"):
        tarp_coverage(samples, truth, references="hpd")
    with pytest.raises(ValueError, match="parameter_names"):
        tarp_coverage(samples, truth, parameter_names=["a", "a", "b"])


def test_dataset_layout_and_summary(small_conjugate):
    names = ["mu", "beta[0]", "sigma_log__"]
    tarp = tarp_coverage(
        small_conjugate.samples(), small_conjugate.truth, parameter_names=names, random_seed=0
    )
    assert dict(tarp.sizes) == {"repeat": 20, "alpha": 21, "parameter": 3, "simulation": 60}
    assert tarp["marginal_ecp"].dims == ("repeat", "parameter", "alpha")
    np.testing.assert_allclose(tarp["credibility"], 1 - DEFAULT_ALPHA)
    np.testing.assert_allclose(
        tarp["coverage_error"], tarp["ecp"] - (1 - tarp["alpha"]), atol=1e-15
    )
    np.testing.assert_allclose(tarp["rmse"], np.sqrt((tarp["coverage_error"] ** 2).mean("alpha")))
    assert {var.dtype.kind for var in tarp.variables.values()} <= {"f", "i", "U"}

    text = coverage_summary(tarp)
    print(text)
    lines = text.splitlines()
    assert len(lines) == 5 and "20 reference repeat(s)" in lines[0]
    assert lines[1].split()[0] == "joint" and f"{float(tarp['rmse'].mean()):.4f}" in lines[1]
    assert [line.split()[0] for line in lines[2:]] == names
    held = tarp["interval_coverage"].sel(parameter="mu")
    assert lines[2].endswith(
        f"{float(held.sel(alpha=0.5)):.2f} / {float(held.sel(alpha=0.1)):.2f}"
    )


def test_netcdf_round_trip(tmp_path, small_conjugate):
    tarp = tarp_coverage(
        small_conjugate.samples(),
        small_conjugate.truth,
        parameter_names=["mu", "beta[0]", "sigma_log__"],
        random_seed=0,
    )
    path = tmp_path / "tarp.nc"
    xr.DataTree.from_dict({"tarp": tarp}).to_netcdf(path)
    back = xr.open_datatree(path)["tarp"].to_dataset().load()

    xr.testing.assert_allclose(back, tarp)
    assert back.attrs == tarp.attrs
    np.testing.assert_allclose(json.loads(back.attrs["alpha_grid"]), tarp["alpha"])
    # The summary reads a DataTree node as it reads a Dataset.
    assert coverage_summary(xr.open_datatree(path)["tarp"]) == coverage_summary(tarp)


@pytest.mark.benchmark
def test_speed_at_paper_scale():
    """K = 500, S = 20 000, d = 20, 20 repeats (the paper's setting); prints the time."""
    import time

    rng = np.random.default_rng(0)
    samples = rng.standard_normal((500, 20_000, 20), dtype=np.float32)
    truth = rng.standard_normal((500, 20))
    start = time.perf_counter()
    tarp_coverage(samples, truth, random_seed=0)
    print(f"\ntarp_coverage K=500 S=20000 d=20 R=20: {time.perf_counter() - start:.1f} s")
