"""Results on disk and the HTML report: compressed netCDF, numbers rounded as ArviZ rounds them,
other posteriors side by side, and the page as a browser draws it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pymc as pm
import pytest
import xarray as xr

import dpppl
from dpppl.app.report import comparison_table, read_result, write_report, write_result


@pytest.fixture(scope="module")
def result() -> xr.DataTree:
    """A quick private fit of a two-coefficient logistic regression (a smoke-size NA-DPVI run)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 2))
    y = rng.binomial(1, 1 / (1 + np.exp(-x @ [1.0, -0.5])))
    with pm.Model(coords={"obs": range(400), "feature": ["a", "b"]}):
        X = pm.Data("X", x, dims=("obs", "feature"))
        w = pm.Normal("w", 0, 1, dims="feature")
        pm.Bernoulli("y", logit_p=X @ w, observed=y, dims="obs")
        return dpppl.sample(
            mechanism="na-dpvi", epsilon=1.0, delta=1e-5, steps=200, posterior="naive",
            draws=400, chains=2, random_seed=0, progressbar=False,
        )


def table(page: str, number: int) -> tuple[list[str], list[list[str]]]:
    """The header and the body rows (as text cells) of the ``number``-th table of the page."""
    html = re.findall(r"<table.*?</table>", page, flags=re.DOTALL)[number]
    head, body = html.split("</thead>")
    rows = re.findall(r"<tr>(.*?)</tr>", body, flags=re.DOTALL)
    return re.findall(r"<th>(.*?)</th>", head), [
        re.findall(r"<t[hd]>(.*?)</t[hd]>", row, flags=re.DOTALL) for row in rows
    ]


def significant_digits(number: str) -> int:
    return len(re.sub(r"^[-0.]*|\.|e.*$", "", number).rstrip("0") or "0")


# -- netCDF ---------------------------------------------------------------------------------------


def test_a_result_is_written_compressed_and_read_back_identical(result, tmp_path):
    import h5py

    path = write_result(result, tmp_path / "result.nc")
    back = read_result(path)
    assert back.attrs == result.attrs
    for node in result.subtree:
        xr.testing.assert_identical(back[node.path].to_dataset(), node.to_dataset())
    stored = {}
    with h5py.File(path) as file:
        file.visititems(
            lambda name, item: stored.update({name: item})
            if isinstance(item, h5py.Dataset) and item.nbytes >= 4096 else None
        )
        assert "dpvi_trace/phi" in stored and "posterior/w" in stored
        assert all(item.compression == "gzip" and item.shuffle for item in stored.values())


# -- numbers --------------------------------------------------------------------------------------


def test_the_summary_table_shows_the_digits_arviz_shows(result, tmp_path):
    page = write_report(result, tmp_path / "report.html").read_text()
    header, rows = table(page, 1)
    assert header[0] == "parameter" and [row[0] for row in rows] == ["w[a]", "w[b]"]
    columns = dict(zip(header, zip(*rows, strict=True), strict=True))
    # Effective sample sizes are whole numbers and R-hat has two decimals, as in az.summary.
    assert all(re.fullmatch(r"\d+", ess) for ess in columns["ess_bulk"] + columns["ess_tail"])
    assert all(re.fullmatch(r"\d\.\d\d", r_hat) for r_hat in columns["r_hat"])
    # Means and intervals are rounded to what their Monte Carlo error supports.
    assert max(significant_digits(v) for v in columns["mean"] + columns["mcse_mean"]) <= 4


def test_the_settings_show_floats_to_the_privacy_statements_four_digits(result, tmp_path):
    page = write_report(result, tmp_path / "report.html").read_text()
    settings = dict(table(page, 0)[1])
    epsilon = result.attrs["dp_epsilon"]
    assert settings["epsilon"] == f"{epsilon:.4g}" and f"{epsilon:.4g}" in dpppl.privacy_statement(
        result
    )
    assert settings["delta"] == "1e-05" and settings["option: steps"] == "200"
    assert significant_digits(settings["noise multiplier"]) <= 4


# -- comparison -----------------------------------------------------------------------------------


def test_other_posteriors_are_drawn_and_tabled_beside_the_result(result, tmp_path):
    shifted = result.copy()
    shifted["posterior"] = xr.DataTree(result["posterior"].to_dataset() + 5.0)
    posteriors = {"this result": result, "shifted by 5": shifted}
    table = comparison_table(posteriors, ci_prob=0.9)
    assert list(table.columns) == ["this result", "shifted by 5"]
    assert list(table.index) == ["w[a]", "w[b]"]
    mean, lower, upper = map(float, re.findall(r"-?[\d.]+", table.loc["w[a]", "shifted by 5"]))
    centre = float(result.posterior["w"].sel(feature="a").mean()) + 5
    assert lower < mean < upper and mean == pytest.approx(centre, rel=0.05)

    page = write_report(result, tmp_path / "report.html", comparison=posteriors).read_text()
    section = page.split("<h2>Compared with other posteriors</h2>")[1]
    assert section.lstrip().startswith('<img alt="credible intervals of every posterior"')
    assert "shifted by 5" in section


# -- in a browser ---------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine")
def test_a_browser_draws_the_report_with_its_figures(result, tmp_path):
    """Headless Chromium renders the page and its inlined figures; the screenshot is kept in
    DPPPL_SCREENSHOT_DIR (or the test's folder) for a person to look at."""
    shifted = result.copy()
    shifted["posterior"] = xr.DataTree(result["posterior"].to_dataset() + 1.0)
    page = write_report(
        result, tmp_path / "report.html", notes=["A quick fit, drawn by a browser in a test."],
        comparison={"this result": result, "shifted by 1": shifted},
    )
    screenshot = tmp_path / "report.png"
    run = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={screenshot}", "--window-size=1200,4200", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    from matplotlib.image import imread

    pixels = imread(screenshot)
    assert pixels.shape[:2] == (4200, 1200)
    # Figures drawn: far more distinct colours than text on white gives.
    colours = np.unique((pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 1000
    if folder := os.environ.get("DPPPL_SCREENSHOT_DIR"):
        shutil.copy(screenshot, folder)
