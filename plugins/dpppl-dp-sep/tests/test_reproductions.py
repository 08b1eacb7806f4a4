"""The paper's experiments at smoke size (``pytest plugins/dpppl-dp-sep -m slow``): each tutorial
runs end to end and its non-private SEP baseline lands where SEP should.  The paper-size runs are
the tutorials' defaults; their tables are in ``tutorials/dpsep_*_results.md``."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TUTORIALS = Path(__file__).resolve().parents[3] / "tutorials"


def tutorial(name: str):
    spec = importlib.util.spec_from_file_location(name, TUTORIALS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses look their module up in sys.modules.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def row(table: str, label: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_mixture_smoke_sep_converges_and_dp_sep_stays_bounded(tmp_path, capsys):
    out = tmp_path / "mixture.md"
    tutorial("dpsep_mixture").main(["--smoke", "--out", str(out)])
    table = out.read_text()
    converged = row(table, "SEP")[3]
    mean_error = float(re.match(r"([-\d.e+]+)", converged).group(1))
    assert mean_error < 0.05
    for epsilon in ("50", "5", "1"):
        dp_mean = float(re.match(r"([-\d.e+]+)", row(table, f"DP-SEP eps={epsilon}")[3]).group(1))
        # Bounded by the noise floor: no longer the 1e5-1e7 of a mean thrown out by noise.
        assert dp_mean < 500


def test_uci_smoke_runs_and_sep_predicts_better_than_the_mean(tmp_path):
    from dpppl.datasets import DatasetNotFoundError, load_uci_regression

    try:
        load_uci_regression("wine-quality-red")
    except DatasetNotFoundError:
        pytest.skip("the UCI regression benchmark files are not available")
    out = tmp_path / "uci.md"
    tutorial("dpsep_uci_regression").main(["--smoke", "--out", str(out)])
    rmse = float(row(out.read_text(), "wine-quality-red")[2].split()[0])
    assert rmse < 0.8  # the target's standard deviation is about 0.81
