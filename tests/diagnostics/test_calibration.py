"""Predictive calibration: calibrated predictors pass, miscalibrated ones are flagged.

Band.  For a calibrated predictor, the outcomes of the records in a bin are independent Bernoulli
variables whose mean is the bin's mean predicted probability, so a bin's calibration error has sd
at most 0.5/√count, and |error| ≤ 4·0.5/√count (``calibrated_bound``) in every one of 10 bins
fails with probability below 1e-3.  The RMSE over bins is then at most the root mean square of
those per-bin bounds (``rmse_bound``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
from scipy.special import expit, logit

from dpppl.diagnostics.calibration import calibration_summary, predictive_calibration
from dpppl.errors import InvalidDataError


def calibrated_bound(calibration: xr.Dataset) -> xr.DataArray:
    """Per repeat and bin: 4 sds of a calibrated bin's error."""
    return 2 / np.sqrt(calibration["count"].where(calibration["count"] > 0))


def rmse_bound(calibration: xr.Dataset) -> xr.DataArray:
    """Per repeat: the RMSE of a calibrated predictor whose every bin is at its bound."""
    return np.sqrt((calibrated_bound(calibration) ** 2).mean("bin"))


def beta_bernoulli(n_groups: int, n_train: int, n_draws: int, seed: int):
    """Posterior-predictive and plug-in probabilities for held-out Bernoulli outcomes.

    Each group has θ ~ Beta(1, 1), ``n_train`` training outcomes and one held-out outcome.  The
    posterior is Beta(1 + s, 1 + n − s); p̃(y = 1) is estimated by averaging θ over posterior
    draws, as a user does for a private posterior.  The plug-in s/n ignores the uncertainty.
    """
    rng = np.random.default_rng(seed)
    theta = rng.uniform(size=n_groups)
    successes = rng.binomial(n_train, theta)
    draws = rng.beta(1 + successes, 1 + n_train - successes, size=(n_draws, n_groups))
    held_out = rng.uniform(size=n_groups) < theta
    return draws.mean(axis=0), successes / n_train, held_out


def test_posterior_predictive_is_calibrated_and_plug_in_is_not():
    predictive, plug_in, held_out = beta_bernoulli(20_000, 10, 500, seed=0)
    good = predictive_calibration(predictive, held_out)
    bad = predictive_calibration(plug_in, held_out)
    good_rmse, bad_rmse = float(good["rmse"][0]), float(bad["rmse"][0])
    print(f"\nposterior predictive RMSE {good_rmse:.4f}, plug-in {bad_rmse:.4f}")

    bound = calibrated_bound(good)
    assert (abs(good["calibration_error"]) < bound).sum() == (good["count"] > 0).sum()
    assert float(good["rmse"][0]) < float(rmse_bound(good)[0])
    # The plug-in says 0 after 0 successes out of 10 though the posterior predictive is 1/12:
    # positives in the lowest bin, negatives in the highest.
    assert float(bad["rmse"][0]) > float(rmse_bound(bad)[0])
    error = bad["calibration_error"].isel(repeat=0)
    assert float(error.isel(bin=0)) > float(calibrated_bound(bad).isel(repeat=0, bin=0))
    assert float(error.isel(bin=-1)) < -float(calibrated_bound(bad).isel(repeat=0, bin=-1))


@pytest.mark.parametrize(("temperature", "side"), [(2.0, -1), (0.5, +1)])
def test_repeated_evaluations_flag_miscalibration(temperature, side):
    rng = np.random.default_rng(1)
    n_repeats, n_records = 5, 40_000
    truth = rng.uniform(size=(n_repeats, n_records))
    outcomes = rng.uniform(size=truth.shape) < truth
    calibrated = predictive_calibration(truth, outcomes)
    # temperature > 1 pushes probabilities to 0 and 1 (over-confident), < 1 towards 1/2.
    distorted = predictive_calibration(expit(temperature * logit(truth)), outcomes)
    print(f"\n{calibration_summary(calibrated)}\n{calibration_summary(distorted)}")

    assert calibrated.sizes["repeat"] == n_repeats
    assert (calibrated["rmse"] < rmse_bound(calibrated)).all()
    assert (distorted["rmse"] > rmse_bound(distorted)).all()
    # Over-confidence: fewer positives than predicted above 1/2, more below; the reverse for
    # under-confidence.  The outer bins show it beyond the band.
    error = distorted["calibration_error"]
    band = calibrated_bound(distorted)
    assert (side * error.isel(bin=-2) > band.isel(bin=-2)).all()
    assert (-side * error.isel(bin=1) > band.isel(bin=1)).all()


def test_bins_counts_and_edges():
    probabilities = np.array([[0.0, 0.1, 0.25, 0.5, 0.99, 1.0], [0.2, 0.2, 0.2, 0.2, 0.2, 0.2]])
    outcomes = np.array([0, 1, 0, 1, 1, 1])
    calibration = predictive_calibration(probabilities, outcomes, bins=[0, 0.25, 0.5, 1])
    np.testing.assert_array_equal(calibration["count"], [[2, 1, 3], [6, 0, 0]])
    np.testing.assert_allclose(calibration["mean_predicted"][0], [0.05, 0.25, (0.5 + 0.99 + 1) / 3])
    np.testing.assert_allclose(calibration["fraction_positive"][0], [0.5, 0.0, 1.0])
    assert np.isnan(calibration["calibration_error"][1, 1:]).all()
    np.testing.assert_allclose(calibration["rmse"][1], abs(4 / 6 - 0.2))
    np.testing.assert_allclose(calibration["bin_lower"], [0, 0.25, 0.5])
    assert json.loads(calibration.attrs["bin_edges"]) == [0, 0.25, 0.5, 1]


def test_invalid_inputs_are_refused():
    with pytest.raises(InvalidDataError, match="in \\[0, 1\\]"):
        predictive_calibration([0.2, 1.5], [0, 1])
    with pytest.raises(InvalidDataError, match="in \\[0, 1\\]"):
        predictive_calibration([0.2, np.nan], [0, 1])
    with pytest.raises(InvalidDataError, match="0/1"):
        predictive_calibration([0.2, 0.4], [0, 2])
    with pytest.raises(InvalidDataError, match="do not match"):
        predictive_calibration([0.2, 0.4], [0, 1, 1])
    with pytest.raises(ValueError, match="bins"):
        predictive_calibration([0.2, 0.4], [0, 1], bins=0)
    with pytest.raises(ValueError, match="bin edges"):
        predictive_calibration([0.2, 0.4], [0, 1], bins=[0.1, 0.5, 1])


def test_netcdf_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    probabilities = rng.uniform(size=(3, 500))
    calibration = predictive_calibration(probabilities, rng.uniform(size=500) < 0.4, bins=20)
    path = tmp_path / "calibration.nc"
    xr.DataTree.from_dict({"predictive_calibration": calibration}).to_netcdf(path)
    back = xr.open_datatree(path)["predictive_calibration"].to_dataset().load()
    xr.testing.assert_allclose(back, calibration)
    assert back.attrs == calibration.attrs
    assert {var.dtype.kind for var in calibration.variables.values()} <= {"f", "i"}
