"""Every tutorial runs at its smoke size, as a reader would run it: a script in a subprocess.

Each test runs ``python tutorials/<script>.py --smoke`` from the repository root, with outputs sent
to a temporary folder, and checks the exit code and the lines a reader is told to expect.  Fits
at smoke size are far too short to mean anything: the numbers themselves are not checked.

Every tutorial runs in the default suite; the reproductions that read the UCI sets from
``../shared/data`` (or ``$DPPPL_DATA``) skip when the data are not there.  All seven took 3.4
minutes on the 2-core development machine with one core busy (2026-11-24; linear_regression 47 s,
exponential_families 36 s, dpsep_mixture 33 s, adult_calibration 28 s, getting_started 21 s,
swag_ppm_imbalanced 19 s, dpsep_uci_regression 18 s), most of it XLA compilation of the DP-SGD
loop and the post-processing, once per process and setting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpppl.datasets import DatasetNotFoundError, find_data_file

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"
#: Per-script wall-clock limit: smoke sizes take well under this on two free cores.
TIMEOUT_S = 600


def launch_tutorial(script: str, *args: str | Path) -> subprocess.CompletedProcess:
    """Run a tutorial script to its end, whatever its exit status."""
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, str(TUTORIALS / script), *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def run_tutorial(script: str, *args: str | Path) -> str:
    """Run a tutorial script; return its stdout, failing with its output if it fails."""
    completed = launch_tutorial(script, *args)
    assert completed.returncode == 0, (
        f"{script} exited with {completed.returncode}\n--- stdout ---\n{completed.stdout[-4000:]}"
        f"\n--- stderr ---\n{completed.stderr[-4000:]}"
    )
    return completed.stdout


def require_data(relative: str) -> None:
    try:
        find_data_file(relative)
    except DatasetNotFoundError:
        pytest.skip(f"data file {relative} not available (see dpppl.datasets)")


def test_getting_started(tmp_path):
    out = run_tutorial("getting_started.py", "--smoke", "--out", tmp_path)
    assert "(epsilon, delta)-DP with epsilon = 0.99" in out
    assert "dp_neighbour_relation = 'add_or_remove_one'" in out
    assert "az.summary" in out and "w[education]" in out
    assert "TARP coverage RMSE" in out and "No privacy budget was spent" in out
    assert "posterior identical: True" in out
    assert "What the file does not contain: []" in out
    for name in ("output.txt", "summary.txt", "forest.png", "tarp.png",
                 "adult_private_posterior.nc"):
        assert (tmp_path / name).is_file(), name


def test_exponential_families(tmp_path):
    out = run_tutorial("exponential_families.py", "--smoke", "--out", tmp_path)
    assert "Joint TARP RMSE at ε = 0.1" in out
    for model in ("Gamma–Exponential", "Beta–Bernoulli", "Dirichlet–Categorical"):
        for method in ("noise-aware", "naive"):
            assert f"{model}, {method}: joint RMSE" in out
    # The Bernstein–Sheldon row runs when its example plugin is installed, else says why not.
    assert "Bernstein–Sheldon" in out or "bernstein-sheldon" in out
    assert (tmp_path / "results.json").is_file()
    assert (tmp_path / "m3_noise-aware_K4.png").is_file()
    report = run_tutorial("exponential_families.py", "--report", "--out", tmp_path)
    assert "Dirichlet–Categorical" in report


def test_linear_regression(tmp_path):
    out = run_tutorial("linear_regression.py", "--smoke", "--out", tmp_path)
    assert "Part 1: one private fit at ε = 1" in out
    assert "w[x10]" in out and "sigma2" in out
    assert "Joint TARP RMSE × 10³" in out and "worst marginal" in out
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["eps1/nuts/K4"]["marginal_rmse_x1000"]) == {
        "sigma2_log__", *(f"w[x{j}]" for j in range(1, 11)), "b"
    }
    assert saved["eps1/nuts/K4"]["options"] == {"chains": 1}  # the paper's one NUTS chain
    assert 0 <= saved["eps1/nuts/K4"]["fits_with_divergences"] <= 4
    for method in ("nuts", "laplace", "naive"):
        assert f"{method} ε = 1: joint RMSE" in out
        assert (tmp_path / f"eps1_{method}_K4.png").is_file()


def test_adult_calibration(tmp_path):
    # --smoke uses the sample that ships with dpppl: no data files needed.
    out = run_tutorial("adult_calibration.py", "--smoke", "--epsilon", "1", "--out", tmp_path,
                       "--option", "settle=False")
    assert "UCI Adult: 1394 training records × 54 features, 473 test records" in out
    assert "Calibration RMSE × 10³ on the held-out test split" in out
    for method in ("nuts", "laplace", "naive"):
        assert f"\n{method} " in out
    assert (tmp_path / "predictions.nc").is_file()
    assert (tmp_path / "reliability_eps1.png").is_file()
    rows = json.loads((tmp_path / "results.json").read_text())
    assert rows and all("--option settle=False" in row["command"] for row in rows)


def test_adult_calibration_refuses_an_invalid_option_before_fitting(tmp_path):
    completed = launch_tutorial("adult_calibration.py", "--smoke", "--out", tmp_path,
                                "--option", "steps=5")
    assert completed.returncode != 0
    assert "at least 10 steps after the burn-in" in completed.stderr
    assert not (tmp_path / "predictions.nc").exists()


def test_swag_ppm_imbalanced(tmp_path):
    require_data("uci-adult/adult.data")
    require_data("uci-regression/wine-quality-red/data.txt")
    table = tmp_path / "swag.md"
    out = run_tutorial("swag_ppm_imbalanced.py", "--smoke", "--out", table)
    assert "SWAG-PPM" in out and "DP-SGD" in out
    assert table.is_file()


def test_dpsep_mixture(tmp_path):
    table = tmp_path / "dpsep_mixture.md"
    out = run_tutorial("dpsep_mixture.py", "--smoke", "--out", table)
    assert "run 1 of" in out
    assert table.is_file()


def test_dpsep_uci_regression(tmp_path):
    require_data("uci-regression/wine-quality-red/data.txt")
    table = tmp_path / "dpsep_uci.md"
    run_tutorial("dpsep_uci_regression.py", "--smoke", "--out", table)
    assert table.is_file()


def test_poisson_regression():
    out = run_tutorial("poisson_regression.py", "--smoke")
    assert '"K": 2' in out and '"coverage_90"' in out


def test_held_out_models():
    out = run_tutorial("held_out_models.py", "ordinal", "--smoke")
    row = json.loads(out.strip().splitlines()[-1])
    assert row["model"] == "ordinal" and row["K"] == 2
    assert set(row["marginal_rmse"]) == {"w[0]", "w[1]", "c0", "gap_log__[0]", "gap_log__[1]"}


def test_held_out_models_fits_set_beside_the_truth_that_drew_them():
    out = run_tutorial("held_out_models.py", "wide_regression", "--against-truth", "2", "--smoke")
    row = json.loads(out.strip().splitlines()[-1])
    # One entry per value variable, in the unconstrained coordinates (s as log s); smoke fits are
    # too short to mean anything, so only the shape of the report is checked.
    assert list(row["variables"]) == ["b0", "w", "s_log__"]
    for figures in row["variables"].values():
        assert figures["z_sd"] >= 0 and 0 <= figures["held_50"] <= figures["held_90"] <= 1


def test_held_out_models_trace_against_exact_nuts():
    out = run_tutorial("held_out_models.py", "wide_regression", "--trace", "302", "--smoke")
    row = json.loads(out.strip().splitlines()[-1])
    # Smoke size: 300 steps, so the steps reported are 0 and 250; the script itself refuses a
    # trace whose coordinates are not the model's value variables in order.
    assert list(row["displacement"]) == ["0", "250"]
    assert row["displacement"]["0"]["rms"] > 0


def test_model_classes():
    out = run_tutorial("model_classes.py", "poisson", "--smoke")
    row = json.loads(out.strip().splitlines()[-1])
    assert row["model"] == "poisson" and row["K"] == 2
    assert set(row["marginal_rmse"]) == {"b0", "w[0]", "w[1]", "w[2]"}
