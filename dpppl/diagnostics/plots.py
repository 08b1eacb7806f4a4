"""Plots of TARP coverage and predictive calibration, in ArviZ's matplotlib style.

Every function draws the mean over the ``repeat`` dimension with a ±1 std band, against the
line a calibrated posterior would follow, and returns the matplotlib ``Figure``.  Pass ``ax`` or
``axes`` to draw into existing axes, for example to overlay several methods with ``label``.
Figures are built without ``pyplot``, so none is left open in a loop; save them with
:func:`save_png`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib.style
import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

#: The ArviZ style the plots are drawn in (registered with matplotlib by ``arviz_plots``).
STYLE = "arviz-variat"
_REFERENCE_LINE = {"color": "0.5", "linestyle": "--", "linewidth": 1.0, "zorder": 0}


def plot_coverage(
    tarp: xr.Dataset | xr.DataTree,
    *,
    ax: Axes | None = None,
    label: str | None = None,
    color: str | None = None,
) -> Figure:
    """Joint expected coverage C(α) against the credibility level 1 − α, with the diagonal.

    Parameters
    ----------
    tarp : xarray.Dataset or xarray.DataTree
        The output of :func:`~dpppl.diagnostics.tarp_coverage` (or the ``tarp`` node).
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure if omitted.
    label, color : str, optional
        Legend label and colour of the curve.

    Returns
    -------
    matplotlib.figure.Figure
    """
    with _arviz_style():
        fig, ax = _figure_and_axes(ax)
        _coverage_panel(ax, tarp["credibility"].values, tarp["ecp"], False, label, color)
    return fig


def plot_coverage_error(
    tarp: xr.Dataset | xr.DataTree,
    *,
    ax: Axes | None = None,
    label: str | None = None,
    color: str | None = None,
) -> Figure:
    """Joint coverage error C(α) − (1 − α) against the credibility level 1 − α.

    Parameters
    ----------
    tarp : xarray.Dataset or xarray.DataTree
        The output of :func:`~dpppl.diagnostics.tarp_coverage` (or the ``tarp`` node).
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure if omitted.
    label, color : str, optional
        Legend label and colour of the curve.

    Returns
    -------
    matplotlib.figure.Figure
    """
    with _arviz_style():
        fig, ax = _figure_and_axes(ax)
        _coverage_panel(ax, tarp["credibility"].values, tarp["coverage_error"], True, label, color)
    return fig


def plot_marginal_coverage(
    tarp: xr.Dataset | xr.DataTree,
    *,
    axes: np.ndarray | list[Axes] | None = None,
    error: bool = False,
    label: str | None = None,
    color: str | None = None,
) -> Figure:
    """Marginal coverage (or its error, ``error=True``), one small panel per parameter.

    Parameters
    ----------
    tarp : xarray.Dataset or xarray.DataTree
        The output of :func:`~dpppl.diagnostics.tarp_coverage` (or the ``tarp`` node).
    axes : array of matplotlib.axes.Axes, optional
        At least one axes per parameter, in parameter order; a new grid if omitted.
    error : bool, default False
        Plot C(α) − (1 − α) instead of C(α).
    label, color : str, optional
        Legend label and colour of the curves.

    Returns
    -------
    matplotlib.figure.Figure
    """
    names = [str(name) for name in tarp["parameter"].values]
    variable = tarp["marginal_coverage_error" if error else "marginal_ecp"]
    x = tarp["credibility"].values
    with _arviz_style():
        if axes is None:
            n_cols = min(len(names), 4)
            n_rows = math.ceil(len(names) / n_cols)
            fig = Figure(figsize=(2.8 * n_cols, 2.6 * n_rows + 0.6))
            grid = fig.subplots(n_rows, n_cols, sharex=True, sharey=True, squeeze=False).ravel()
            for spare in grid[len(names) :]:
                spare.set_visible(False)
        else:
            grid = np.ravel(axes)
            if grid.size < len(names):
                raise ValueError(f"need {len(names)} axes, one per parameter, got {grid.size}")
            fig = grid[0].get_figure(root=True)
        for i, (panel, name) in enumerate(zip(grid, names, strict=False)):
            values = variable.sel(parameter=name)
            _coverage_panel(panel, x, values, error, label if i == 0 else None, color)
            panel.set_title(name, fontsize="medium")
            panel.set(xlabel="", ylabel="")
        fig.supxlabel("credibility level 1 − α")
        fig.supylabel("C(α) − (1 − α)" if error else "marginal coverage C(α)")
    return fig


def plot_reliability(
    calibration: xr.Dataset | xr.DataTree,
    *,
    axes: np.ndarray | list[Axes] | None = None,
    label: str | None = None,
    color: str | None = None,
) -> Figure:
    """Reliability diagram over its calibration-error panel.

    The top panel shows the observed fraction of positives against the mean predicted probability
    of each bin, with the diagonal; the bottom one the calibration error (fraction of positives −
    predicted probability), with zero.

    Parameters
    ----------
    calibration : xarray.Dataset or xarray.DataTree
        The output of :func:`~dpppl.diagnostics.predictive_calibration`.
    axes : pair of matplotlib.axes.Axes, optional
        Axes for the curve and the error; a new two-row figure if omitted.
    label, color : str, optional
        Legend label and colour of the curves.

    Returns
    -------
    matplotlib.figure.Figure
    """
    x = calibration["mean_predicted"].mean("repeat").values
    with _arviz_style():
        if axes is None:
            fig = Figure(figsize=(5.5, 6.5))
            top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
        else:
            top, bottom = np.ravel(axes)[:2]
            fig = top.get_figure(root=True)
        top.axline((0, 0), (1, 1), **_REFERENCE_LINE)
        line = _band(top, x, calibration["fraction_positive"], label, color)
        top.set(ylabel="fraction of positives", xlim=(0, 1), ylim=(0, 1))
        bottom.axhline(0, **_REFERENCE_LINE)
        _band(bottom, x, calibration["calibration_error"], None, line.get_color())
        bottom.set(xlabel="predicted probability", ylabel="calibration error")
        if label is not None:
            top.legend(loc="best")
    return fig


def save_png(fig: Figure, path: str | Path, *, dpi: int = 150) -> Path:
    """Save a figure as PNG, creating the folder if needed, and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
    return path


@contextmanager
def _arviz_style() -> Iterator[None]:
    # Imported here because arviz_plots takes seconds to import and only the plots need its
    # styles; the style applies to what these functions draw and leaves the caller's rcParams.
    import arviz_plots  # noqa: F401

    with matplotlib.style.context(STYLE):
        yield


def _figure_and_axes(ax: Axes | None) -> tuple[Figure, Axes]:
    if ax is None:
        fig = Figure(figsize=(5.0, 4.5))
        return fig, fig.add_subplot()
    return ax.get_figure(root=True), ax


def _coverage_panel(
    ax: Axes, x: np.ndarray, values: xr.DataArray, error: bool, label: str | None, color: str | None
) -> None:
    """A coverage (or coverage-error) curve against credibility, with the calibrated line."""
    if error:
        ax.axhline(0, **_REFERENCE_LINE)
        ax.set_ylabel("C(α) − (1 − α)")
    else:
        ax.axline((0, 0), (1, 1), **_REFERENCE_LINE)
        ax.set(ylim=(0, 1), ylabel="expected coverage C(α)")
    _band(ax, x, values, label, color)
    ax.set(xlim=(0, 1), xlabel="credibility level 1 − α")
    if label is not None:
        ax.legend(loc="best")


def _band(
    ax: Axes, x: np.ndarray, values: xr.DataArray, label: str | None, color: str | None
) -> Line2D:
    """Mean over ``repeat`` as a line with markers, ±1 std as a shaded band; returns the line."""
    mean = values.mean("repeat").values
    std = values.std("repeat").values
    (line,) = ax.plot(x, mean, marker="o", markersize=3, label=label, color=color)
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.3, linewidth=0)
    return line
