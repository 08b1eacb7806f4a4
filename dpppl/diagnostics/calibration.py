"""Predictive calibration of binary outcomes on held-out data (NA-DPVI paper, Section 4.4, Fig. 4).

The predicted probability of a held-out record is the posterior-predictive average
p̃(y = 1 | x) = ∫ p(y = 1 | x, θ) p̃(θ | ξ) dθ (eq. 29), which the user estimates by averaging
p(y = 1 | x, θ) over posterior draws.  Records are binned by that probability; in each bin the
observed fraction of positives should match the mean predicted probability.  The calibration error
of a bin is (fraction of positives − mean predicted probability) and its RMSE over the non-empty
bins, each bin counting once, is the summary of Table 3.  Repeated evaluations (for example 20
independent private fits) give mean ± std of every curve.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr
from numpy.typing import ArrayLike

from dpppl.errors import InvalidDataError

DEFAULT_BINS = 10


def predictive_calibration(
    probabilities: ArrayLike, outcomes: ArrayLike, *, bins: int | ArrayLike = DEFAULT_BINS
) -> xr.Dataset:
    """Binned reliability curve, calibration error per bin and its RMSE.

    Parameters
    ----------
    probabilities : array_like, shape (n,) or (R, n)
        Posterior-predictive probabilities p̃(y = 1 | x) of n held-out records, for one or R
        repeated evaluations.  Pass the average over posterior draws, not the draws themselves.
    outcomes : array_like of 0/1 or bool, shape (n,) or (R, n)
        Observed outcomes; a single row is shared by every repeat (the same test set).
    bins : int or array_like, default 10
        Number of equal-width bins on [0, 1], or increasing bin edges from 0 to 1.  Bins are
        half-open [lower, upper) except the last, which holds probability 1.

    Returns
    -------
    xarray.Dataset
        Dims ``repeat`` and ``bin`` (with coordinates ``bin_lower``, ``bin_upper``).  Variables
        ``count``, ``mean_predicted``, ``fraction_positive`` and ``calibration_error``
        (repeat, bin; NaN in an empty bin) and ``rmse`` (repeat).  Attributes record the
        settings; structured ones are JSON strings, so the Dataset survives ``to_netcdf``.

    Raises
    ------
    InvalidDataError
        If the probabilities are outside [0, 1] or the outcomes are not 0/1, or shapes disagree.
    ValueError
        If ``bins`` is invalid.
    """
    probabilities, outcomes = _check_predictions(probabilities, outcomes)
    edges = _bin_edges(bins)
    n_repeats, n_records = probabilities.shape
    n_bins = edges.size - 1

    index = np.clip(np.searchsorted(edges, probabilities, side="right") - 1, 0, n_bins - 1)
    # One bincount over (repeat, bin) pairs bins every repeat at once.
    flat = (np.arange(n_repeats)[:, np.newaxis] * n_bins + index).ravel()
    size = n_repeats * n_bins
    count = np.bincount(flat, minlength=size).reshape(n_repeats, n_bins)
    mean_predicted = _bin_mean(flat, probabilities.ravel(), count)
    fraction_positive = _bin_mean(flat, outcomes.ravel(), count)
    error = fraction_positive - mean_predicted
    rmse = np.sqrt(np.nanmean(error**2, axis=1))

    data = {
        "count": (("repeat", "bin"), count, {"long_name": "held-out records in the bin"}),
        "mean_predicted": (
            ("repeat", "bin"),
            mean_predicted,
            {"long_name": "mean predicted probability"},
        ),
        "fraction_positive": (
            ("repeat", "bin"),
            fraction_positive,
            {"long_name": "observed fraction of positives"},
        ),
        "calibration_error": (
            ("repeat", "bin"),
            error,
            {"long_name": "fraction of positives - mean predicted probability"},
        ),
        "rmse": (
            "repeat",
            rmse,
            {"long_name": "RMSE of the calibration error over non-empty bins"},
        ),
    }
    coords = {
        "repeat": np.arange(n_repeats),
        "bin": np.arange(n_bins),
        "bin_lower": ("bin", edges[:-1]),
        "bin_upper": ("bin", edges[1:]),
    }
    attrs = {
        "diagnostic": "predictive_calibration",
        "n_records": n_records,
        "n_repeats": n_repeats,
        "n_bins": n_bins,
        "bin_edges": json.dumps(edges.tolist()),
    }
    return xr.Dataset(data, coords=coords, attrs=attrs)


def calibration_summary(calibration: xr.Dataset | xr.DataTree) -> str:
    """RMSE of the calibration error, mean ± std over the repeats.

    Parameters
    ----------
    calibration : xarray.Dataset or xarray.DataTree
        The output of :func:`predictive_calibration`, or a ``DataTree`` node holding it.

    Returns
    -------
    str
        One line, ready to print.
    """
    rmse = calibration["rmse"]
    attrs = calibration.attrs
    return (
        f"Predictive calibration RMSE {float(rmse.mean()):.4f} ± {float(rmse.std()):.4f} "
        f"(mean ± std over {int(attrs['n_repeats'])} repeat(s); {int(attrs['n_records'])} "
        f"held-out records in {int(attrs['n_bins'])} bins)"
    )


def _check_predictions(
    probabilities: ArrayLike, outcomes: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    probabilities = np.asarray(probabilities, dtype=float)
    if probabilities.ndim == 1:
        probabilities = probabilities[np.newaxis]
    if probabilities.ndim != 2 or probabilities.shape[1] < 1:
        raise InvalidDataError(
            f"probabilities must have shape (records,) or (repeats, records), "
            f"got {probabilities.shape}"
        )
    if not np.all((probabilities >= 0) & (probabilities <= 1)):
        raise InvalidDataError("probabilities must lie in [0, 1] (and not be NaN)")
    outcomes = np.asarray(outcomes)
    if not np.all((outcomes == 0) | (outcomes == 1)):
        raise InvalidDataError("outcomes must be 0/1 or boolean")
    try:
        outcomes = np.broadcast_to(outcomes.astype(float), probabilities.shape)
    except ValueError:
        raise InvalidDataError(
            f"outcomes of shape {outcomes.shape} do not match probabilities {probabilities.shape}"
        ) from None
    return probabilities, outcomes


def _bin_edges(bins: int | ArrayLike) -> np.ndarray:
    if np.ndim(bins) == 0:
        if int(bins) != bins or int(bins) < 1:
            raise ValueError(f"bins must be a positive integer or an array of edges, got {bins}")
        return np.linspace(0.0, 1.0, int(bins) + 1)
    edges = np.asarray(bins, dtype=float)
    if (
        edges.ndim != 1
        or edges.size < 2
        or edges[0] != 0
        or edges[-1] != 1
        or not np.all(np.diff(edges) > 0)
    ):
        raise ValueError("bin edges must increase strictly from 0 to 1")
    return edges


def _bin_mean(flat_index: np.ndarray, values: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Mean of ``values`` per (repeat, bin), NaN where the bin is empty."""
    total = np.bincount(flat_index, weights=values, minlength=count.size).reshape(count.shape)
    return np.divide(total, count, out=np.full(count.shape, np.nan), where=count > 0)
