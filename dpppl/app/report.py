"""A report of a private result as one self-contained HTML page.

>>> dpppl.app.report.write_report(idata, "report.html")

The page holds the privacy statement, the settings the result records, the ArviZ summary of the
posterior, a plot of every marginal, the TARP coverage when the result has a ``tarp`` group
(or one is passed), and other posteriors of the same model when the caller gives some to compare
with.  Numbers are rounded as ArviZ rounds them: the summary by ArviZ itself (digits from the
Monte Carlo error), other floats to significant digits.  Figures are PNGs inlined as ``data:`` URIs, so the page can be mailed or
archived on its own.  It shows only what the result holds: DP releases and public metadata.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import arviz as az
import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure

from dpppl.diagnostics import coverage_summary
from dpppl.diagnostics.plots import STYLE
from dpppl.diagnostics.study import plot_tarp
from dpppl.errors import DPPPLError
from dpppl.results import PrivacyMetadata, privacy_statement
from dpppl.version import __version__


class ResultFileError(DPPPLError):
    """A file is not a readable dpppl result."""


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 62rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.45; }}
h1 {{ font-size: 1.6rem; }} h2 {{ font-size: 1.2rem; margin-top: 2rem; }}
table {{ border-collapse: collapse; font-size: 0.9rem; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 0.2rem 0.6rem; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
.statement {{ background: #eef5ee; border-left: 4px solid #4a8a4a; padding: 0.6rem 1rem; }}
.note {{ background: #fdf6e3; border-left: 4px solid #c8a040; padding: 0.6rem 1rem; }}
pre {{ background: #f6f6f6; padding: 0.6rem; overflow-x: auto; }}
img {{ max-width: 100%; }}
</style>
</head>
<body>
<h1>{title}</h1>
{body}
<p><small>Written by dpppl {version}.</small></p>
</body>
</html>
"""


#: netCDF compression of the files dpppl writes: zlib with byte shuffling, which groups the
#: exponent bytes of noisy float64 draws (they compress; their mantissas do not).  Level 4 was
#: within 1 % of level 9 in size on the demo's result.
COMPRESSION = {"zlib": True, "complevel": 4, "shuffle": True}
#: Arrays smaller than this are stored as they are: compressing them gains less than the index of
#: their HDF5 chunks costs (a result of a few hundred draws grew by a tenth when they were).
COMPRESS_FROM_BYTES = 4096


def write_result(result: xr.DataTree, path: str | Path) -> Path:
    """Write ``result`` as compressed netCDF, readable by :func:`read_result` and
    ``xarray.open_datatree`` like any ``to_netcdf`` file.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = Path(path)
    encoding = {
        node.path: {
            name: dict(COMPRESSION)
            # Coordinates too: a trace's step numbers are as long as the trace.
            for name, variable in node.to_dataset(inherit=False).variables.items()
            # Numbers only; HDF5 compresses chunked arrays, never scalars.
            if variable.ndim
            and variable.nbytes >= COMPRESS_FROM_BYTES
            and variable.dtype.kind in "biuf"
        }
        for node in result.subtree
    }
    result.to_netcdf(path, encoding={group: names for group, names in encoding.items() if names})
    return path


def read_result(path: str | Path) -> xr.DataTree:
    """Read a result saved with ``to_netcdf`` or :func:`write_result` into memory (the file is
    closed again).

    Raises
    ------
    ResultFileError
        If the file is not netCDF, or carries no dpppl privacy metadata.
    """
    try:
        with xr.open_datatree(path) as tree:
            result = tree.load()
    except (OSError, ValueError) as error:
        raise ResultFileError(
            f"{path} is not a readable netCDF file ({type(error).__name__})"
        ) from None
    try:
        complete = "posterior" in result.children and bool(PrivacyMetadata.from_result(result))
    except (KeyError, TypeError, ValueError):
        complete = False
    if not complete:
        raise ResultFileError(
            f"{path} is not a dpppl result: it lacks the posterior or the dp_* privacy attributes"
        )
    return result


def write_report(
    result: xr.DataTree,
    path: str | Path,
    *,
    tarp: xr.Dataset | None = None,
    title: str = "Differentially private posterior",
    notes: Sequence[str] = (),
    comparison: Mapping[str, xr.DataTree] | None = None,
) -> Path:
    """Write the report of ``result`` as a self-contained HTML page.

    Parameters
    ----------
    result
        A result of :func:`dpppl.sample` (or one read back from netCDF).
    path
        The HTML file to write; its folder is created.
    tarp
        A TARP study (:func:`dpppl.diagnostics.tarp_coverage` output) to show; the result's own
        ``tarp`` group when None, and no coverage section when it has none.
    title
        Heading of the page.
    notes
        Paragraphs shown under the heading (for example how the result was made).
    comparison
        Posteriors of the same model by label, ``result`` among them, drawn side by side (a
        forest plot of their intervals and a table).  The caller says in ``notes`` what they
        are; any that is not private must say so in its label.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    if tarp is None and "tarp" in result.children:
        tarp = result["tarp"].to_dataset()
    sections = [f'<p class="note">{html.escape(note)}</p>' for note in notes]
    sections += [
        "<h2>Privacy guarantee</h2>",
        f'<p class="statement">{_lines(privacy_statement(result))}</p>',
        _table(settings_table(result), index_name="setting"),
        "<h2>Posterior summary</h2>",
        _table(az.summary(result), index_name="parameter"),
        "<h2>Posterior marginals</h2>",
        _image(posterior_figure(result), "posterior marginal densities"),
    ]
    if comparison:
        sections += [
            "<h2>Compared with other posteriors</h2>",
            _image(comparison_figure(comparison), "credible intervals of every posterior"),
            _table(comparison_table(comparison), index_name="parameter"),
        ]
    if tarp is not None:
        sections += _tarp_section(tarp)
    page = _PAGE.format(
        title=html.escape(title), body="\n".join(sections), version=html.escape(__version__)
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def settings_table(result: xr.DataTree) -> pd.DataFrame:
    """How the result was made, from its ``dp_*`` attributes: one row per setting."""
    meta = PrivacyMetadata.from_result(result)
    rows = {
        "mechanism": meta.mechanism,
        "guarantee": meta.guarantee,
        "epsilon": meta.epsilon,
        "delta": meta.delta,
        "neighbour relation": meta.neighbour_relation.value,
        "accountant": meta.accountant or "none",
        "noise multiplier": meta.noise_multiplier,
        "records": meta.n_records,
    }
    rows |= {f"option: {name}": value for name, value in meta.mechanism_settings.items()}
    rows |= {f"plugin: {name}": value for name, value in meta.plugins.items()}
    rows["created"] = meta.created_at or None
    rows["dpppl version"] = meta.dpppl_version or None
    return pd.DataFrame(
        {"value": [_setting(v) for v in rows.values() if v is not None]},
        index=[k for k, v in rows.items() if v is not None],
    )


#: Significant digits of the floats in the settings table: those of the privacy statement, so that
#: ε reads the same in both (ArviZ's default of 2 would show ε = 0.995 as 0.99).
SETTING_DIGITS = 4


def _setting(value: object) -> str:
    """A setting as text; floats rounded to significant digits, as ArviZ rounds (then ``:g``)."""
    if isinstance(value, float | np.floating) and np.isfinite(value):
        return f"{float(f'{value:.{SETTING_DIGITS}g}'):g}"
    return str(value)


def posterior_figure(result: xr.DataTree) -> Figure:
    """The marginal density of every posterior variable (and coordinate), one panel each."""
    # arviz_plots takes seconds to import; only the figures need it.
    import arviz_plots as azp
    import matplotlib.style

    with matplotlib.style.context(STYLE):
        plots = azp.plot_dist(result, backend="matplotlib")
    return plots.viz["figure"].item()


def comparison_figure(posteriors: Mapping[str, xr.DataTree]) -> Figure:
    """A forest plot of every posterior's credible intervals, one colour per posterior."""
    import arviz_plots as azp
    import matplotlib.style

    with matplotlib.style.context(STYLE):
        plots = azp.plot_forest(dict(posteriors), combined=True, backend="matplotlib")
        plots.add_legend("model")
    return plots.viz["figure"].item()


def comparison_table(
    posteriors: Mapping[str, xr.DataTree], *, ci_prob: float | None = None
) -> pd.DataFrame:
    """Posterior mean and equal-tailed interval of every parameter, one column per posterior.

    Cells read ``mean [lower, upper]``, rounded by ArviZ to ``rcParams["stats.round_to"]``
    (2 significant digits by default); ``ci_prob`` defaults to ArviZ's ``stats.ci_prob``.
    """
    from arviz_base import rcParams

    columns = {}
    for label, tree in posteriors.items():
        stats = az.summary(tree, kind="stats", ci_prob=ci_prob, round_to=rcParams["stats.round_to"])
        lower, upper = (c for c in stats.columns if c.endswith(("_lb", "_ub")))
        columns[label] = pd.Series(
            [f"{row['mean']:g} [{row[lower]:g}, {row[upper]:g}]" for _, row in stats.iterrows()],
            index=stats.index,
        )
    return pd.DataFrame(columns)


def _tarp_section(tarp: xr.Dataset) -> list[str]:
    note = tarp.attrs.get("privacy_note")
    return [
        "<h2>Coverage (TARP)</h2>",
        (
            "<p>Expected coverage of the private posterior's credible regions on "
            f"{int(tarp.attrs['n_simulations'])} data sets simulated from the model: a calibrated "
            "posterior follows the diagonal, within the noise of that many simulations.</p>"
        ),
        *([f'<p class="note">{html.escape(str(note))}</p>'] if note else []),
        _image(plot_tarp(tarp), "TARP expected coverage, its error, and the marginal coverages"),
        f"<pre>{html.escape(coverage_summary(tarp))}</pre>",
    ]


def _table(frame: pd.DataFrame, *, index_name: str) -> str:
    # Named on the columns, not moved out of the index: az.summary's frame formats its cells by
    # index label when it writes HTML, and a reset index would print every digit.
    return frame.rename_axis(columns=index_name).to_html(border=0, na_rep="")


def _image(fig: Figure, alt: str) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}">'


def _lines(text: str) -> str:
    return "<br>".join(html.escape(line) for line in text.splitlines())
