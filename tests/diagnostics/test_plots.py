"""Plots: they draw the expected lines, overlay into given axes and save non-trivial PNGs."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import xarray as xr
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from dpppl.diagnostics.calibration import predictive_calibration
from dpppl.diagnostics.plots import (
    plot_coverage,
    plot_coverage_error,
    plot_marginal_coverage,
    plot_reliability,
    save_png,
)
from dpppl.diagnostics.tarp import tarp_coverage

NAMES = ["mu", "beta[0]", "sigma_log__"]


@pytest.fixture(scope="module")
def tarp(small_conjugate):
    return tarp_coverage(
        small_conjugate.samples(), small_conjugate.truth, parameter_names=NAMES, random_seed=0
    )


@pytest.fixture(scope="module")
def calibration():
    rng = np.random.default_rng(0)
    probabilities = rng.uniform(size=(4, 2000))
    return predictive_calibration(probabilities, rng.uniform(size=2000) < probabilities[0])


def _curve(ax):
    """The data line of a panel: the one with markers (reference lines have none)."""
    (line,) = [line for line in ax.get_lines() if line.get_marker() not in (None, "None", "")]
    return line


def _assert_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_coverage_curve_and_error(tarp, tmp_path):
    fig = plot_coverage(tarp, label="exact")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    line = _curve(ax)
    np.testing.assert_allclose(line.get_xdata(), 1 - tarp["alpha"])
    np.testing.assert_allclose(line.get_ydata(), tarp["ecp"].mean("repeat"))
    assert len(ax.get_lines()) == 2  # the curve and the diagonal
    assert any(isinstance(c, PolyCollection) for c in ax.collections)  # the ±std band
    assert ax.get_legend().get_texts()[0].get_text() == "exact"
    _assert_png(save_png(fig, tmp_path / "coverage.png"))

    fig = plot_coverage_error(tarp)
    np.testing.assert_allclose(
        _curve(fig.axes[0]).get_ydata(), tarp["coverage_error"].mean("repeat")
    )
    _assert_png(save_png(fig, tmp_path / "sub" / "error.png"))


def test_overlay_into_given_axes(tarp):
    fig = Figure()
    ax = fig.add_subplot()
    assert plot_coverage(tarp, ax=ax, label="a") is fig
    assert plot_coverage(tarp, ax=ax, label="b", color="k") is fig
    assert len(ax.get_lines()) == 4
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]


def test_marginal_panels(tarp, tmp_path):
    fig = plot_marginal_coverage(tarp)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == NAMES
    for ax, name in zip(visible, NAMES, strict=True):
        np.testing.assert_allclose(
            _curve(ax).get_ydata(), tarp["marginal_ecp"].sel(parameter=name).mean("repeat")
        )
    _assert_png(save_png(fig, tmp_path / "marginal.png"))

    fig = plot_marginal_coverage(tarp, error=True)
    np.testing.assert_allclose(
        _curve(fig.axes[1]).get_ydata(),
        tarp["marginal_coverage_error"].sel(parameter="beta[0]").mean("repeat"),
    )
    with pytest.raises(ValueError, match="one per parameter"):
        plot_marginal_coverage(tarp, axes=Figure().subplots(1, 2))


def test_reliability_diagram(calibration, tmp_path):
    fig = plot_reliability(calibration, label="calibrated")
    top, bottom = fig.axes
    np.testing.assert_allclose(
        _curve(top).get_xdata(), calibration["mean_predicted"].mean("repeat")
    )
    np.testing.assert_allclose(
        _curve(top).get_ydata(), calibration["fraction_positive"].mean("repeat")
    )
    np.testing.assert_allclose(
        _curve(bottom).get_ydata(), calibration["calibration_error"].mean("repeat")
    )
    assert len(top.get_lines()) == 2 and len(bottom.get_lines()) == 2
    _assert_png(save_png(fig, tmp_path / "reliability.png"))


def test_plots_read_datatree_nodes_and_leave_rcparams(tarp, calibration):
    before = dict(matplotlib.rcParams)
    tree = xr.DataTree.from_dict({"tarp": tarp, "predictive_calibration": calibration})
    plot_coverage(tree["tarp"])
    plot_marginal_coverage(tree["tarp"])
    plot_reliability(tree["predictive_calibration"])
    assert dict(matplotlib.rcParams) == before
