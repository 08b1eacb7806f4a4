"""The ``dpppl`` command, run as a user runs it: a subprocess, its output and its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dpppl.app.model_file import EXAMPLE_MODEL_FILE

#: Options that make a fit take seconds: a smoke test of the plumbing, not of the mechanism.
QUICK = ["--option", "steps=100", "--option", "posterior=naive", "--option", "chains=1"]

FIT = ["fit", "model.py", "--data", "data.csv", "--mechanism", "na-dpvi", "--epsilon", "1",
       "--delta", "1e-5", "--out", "out/result.nc", *QUICK]  # fmt: skip


def fit_with(**changes: str) -> list[str]:
    """The ``dpppl fit`` command line of the project, with some of its words replaced."""
    return [changes.get(word, word) for word in FIT]


def dpppl(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m dpppl.app.cli ARGS`` and capture what it prints."""
    return subprocess.run(
        [sys.executable, "-m", "dpppl.app.cli", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def assert_user_error(run: subprocess.CompletedProcess, code: int, *phrases: str) -> None:
    """Exit ``code``, nothing on stdout, a message with ``phrases`` on stderr, no traceback."""
    assert run.returncode == code, run.stderr
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    for phrase in phrases:
        assert phrase in run.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A folder with the documented example model.py and data.csv (500 rows it fits)."""
    folder = tmp_path_factory.mktemp("project")
    (folder / "model.py").write_text(EXAMPLE_MODEL_FILE)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 2))
    y = rng.binomial(1, 1 / (1 + np.exp(-x @ [1.0, -1.0])))
    rows = [f"{a:.6f},{b:.6f},{c}" for (a, b), c in zip(x, y, strict=True)]
    (folder / "data.csv").write_text("x1,x2,y\n" + "\n".join(rows) + "\n")
    return folder


@pytest.fixture(scope="module")
def fitted(project) -> subprocess.CompletedProcess:
    """``dpppl fit`` on the project, writing out/result.nc and out/report.html."""
    return dpppl(*FIT, "--report", "out/report.html", cwd=project)


# -- help, plugins, accountant --------------------------------------------------------------------


def test_fit_help_documents_the_model_file_contract_and_the_exit_codes():
    # Through the installed script, as the README runs it.
    script = Path(sys.executable).with_name("dpppl")
    run = subprocess.run(
        [script, "fit", "--help"], check=False, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0
    assert "def build_model(data: pandas.DataFrame) -> pymc.Model" in run.stdout
    assert "--option NAME=VALUE" in run.stdout and "--accountant" in run.stdout
    assert "exit codes:" in run.stdout and "the command line is wrong" in run.stdout


def test_plugins_lists_mechanisms_and_accountants_with_their_distributions():
    run = dpppl("plugins")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "mechanisms:" and "accountants:" in lines
    assert any(line.split()[:3] == ["na-dpvi", "dpppl-na-dpvi", "0.1.0"] for line in lines)
    assert any(line.split()[:2] == ["pld", "dpppl-dp-accounting"] for line in lines)
    assert any(line.split()[:2] == ["prv", "dpppl-prv"] for line in lines)
    assert any(line.strip().startswith("options: steps=10000, sampling_rate=0.1,") for line in lines)


def test_plugins_answers_from_the_stored_listing_without_loading_pymc_or_jax(tmp_path):
    """The listing is kept in the user cache, so only the first ``dpppl plugins`` after a
    plugin changes waits for the plugins to load."""
    probe = (
        "import json, sys, contextlib, io\n"
        "import dpppl.app.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    code = dpppl.app.cli.main(['plugins', '--json'])\n"
        "print(json.dumps({'code': code, 'listing': json.loads(out.getvalue()),\n"
        "                  'heavy': [m for m in ('pymc', 'jax', 'pytensor', 'arviz') if m in sys.modules]}))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", probe], env=env, check=True, capture_output=True,
                text=True, timeout=120,
            ).stdout
        )
        for _ in range(2)
    ]
    assert runs[0]["code"] == runs[1]["code"] == 0
    assert runs[1]["listing"] == runs[0]["listing"]
    assert "jax" in runs[0]["heavy"] and runs[1]["heavy"] == []
    na_dpvi = next(row for row in runs[1]["listing"]["mechanisms"] if row["name"] == "na-dpvi")
    assert na_dpvi["distribution"] == "dpppl-na-dpvi" and na_dpvi["options"]["steps"] == 10000


def test_accountant_finds_sigma_for_a_target_and_epsilon_for_that_sigma():
    setting = ["--delta", "1e-5", "--sampling-rate", "0.1", "--steps", "1000",
               "--accountant", "rdp"]  # fmt: skip
    calibrated = dpppl("accountant", "--epsilon", "1", *setting, "--json")
    assert calibrated.returncode == 0, calibrated.stderr
    answer = json.loads(calibrated.stdout)
    assert answer["accountant"] == "rdp" and 0.99 <= answer["epsilon"] <= 1.0
    accounted = dpppl(
        "accountant", "--noise-multiplier", answer["noise_multiplier"], *setting, "-q"
    )
    assert accounted.returncode == 0, accounted.stderr
    assert float(accounted.stdout) == pytest.approx(answer["epsilon"], rel=1e-5)


# -- fit and report -------------------------------------------------------------------------------


def test_fit_prints_the_summary_and_the_guarantee_and_says_where_the_files_are(fitted, project):
    assert fitted.returncode == 0, fitted.stderr
    assert "Posterior summary (ArviZ):" in fitted.stdout
    assert "w[x1]" in fitted.stdout and "w[x2]" in fitted.stdout
    assert "(epsilon, delta)-DP with epsilon = 0.99" in fitted.stdout
    assert "500 records" in fitted.stdout and "Mechanism: na-dpvi" in fitted.stdout
    result, report = project / "out" / "result.nc", project / "out" / "report.html"
    assert fitted.stdout.rstrip().endswith(f"Result:  {result}\nReport:  {report}")
    assert result.stat().st_size > 0 and "<img" in report.read_text()


def test_report_reads_a_saved_result(fitted, project, tmp_path):
    run = dpppl("report", project / "out" / "result.nc", "--out", tmp_path / "again.html", "--json")
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["privacy"]["dp_mechanism"] == "na-dpvi"
    assert answer["privacy"]["dp_epsilon"] <= 1.0
    assert answer["privacy_statement"].startswith("(epsilon, delta)-DP with epsilon = 0.99")
    assert set(answer["summary"]) == {"w[x1]", "w[x2]"}
    page = Path(answer["report"]).read_text()
    assert page.startswith("<!DOCTYPE html>") and "Privacy guarantee" in page


# -- user mistakes --------------------------------------------------------------------------------

#: Each mistake: the command line, the exit code, and what the message must say.
MISTAKES = {
    "missing-model-file": (fit_with(**{"model.py": "missing.py"}), 2, ["no such file: missing.py"]),
    "bad-epsilon": (fit_with(**{"1": "-1"}), 2, ["--epsilon", "positive"]),
    "unknown-mechanism": (
        fit_with(**{"na-dpvi": "no-such-mechanism"}),
        2,
        ["no mechanism named 'no-such-mechanism'", "installed mechanisms:"],
    ),
    "unknown-option": (fit_with(**{"steps=100": "stepz=100"}), 2, ["bad --option", "stepz"]),
    "missing-label": (
        fit_with(**{"data.csv": "holes.csv"}),
        1,
        ["dpppl fit: error:", "'y' has missing values", "Drop or impute"],
    ),
    "report-missing-file": (["report", "nothing.nc"], 2, ["no such file: nothing.nc"]),
    "report-not-a-result": (["report", "data.csv"], 1, ["not a readable netCDF file"]),
    "accountant-bad-delta": (
        ["accountant", "--epsilon=1", "--delta=1.5", "--sampling-rate=0.1", "--steps=9"],
        2,
        ["--delta", "strictly between 0 and 1"],
    ),
}


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    """Every run of :data:`MISTAKES`, two at a time (they are independent), in a folder with the
    example model, a small data.csv and a holes.csv whose outcome column misses a value."""
    folder = tmp_path_factory.mktemp("mistakes")
    (folder / "model.py").write_text(EXAMPLE_MODEL_FILE)
    (folder / "data.csv").write_text("x1,x2,y\n0.5,1.0,1\n0.3,0.2,0\n")
    (folder / "holes.csv").write_text("x1,x2,y\n0.5,1.0,1\n0.3,0.2,\n0.1,0.3,1\n")
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = {
            name: pool.submit(dpppl, *args, cwd=folder) for name, (args, _, _) in MISTAKES.items()
        }
        return folder, {name: run.result() for name, run in runs.items()}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_user_mistakes_get_a_message_and_an_exit_code_but_no_traceback(mistake, mistakes):
    folder, runs = mistakes
    args, code, phrases = MISTAKES[mistake]
    assert_user_error(runs[mistake], code, *phrases)
    if code == 2:
        assert f"usage: dpppl {args[0]}" in runs[mistake].stderr
    assert not (folder / "out").exists()


def test_errors_of_the_model_file_are_located_but_never_quote_the_data(tmp_path):
    (tmp_path / "broken.py").write_text(
        "def build_model(data):\n    raise ValueError(f'odd value {data.iloc[1, 0]}')\n"
    )
    (tmp_path / "secret.csv").write_text("x1,x2,y\n0.5,1.0,1\n31415.9265,0.2,0\n")
    run = dpppl(*fit_with(**{"model.py": "broken.py", "data.csv": "secret.csv"}), cwd=tmp_path)
    assert_user_error(run, 1, "raised ValueError at broken.py:2")
    assert "31415" not in run.stderr


# -- demo -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """``dpppl demo --smoke`` with a two-data-set TARP check, and its folder."""
    folder = tmp_path_factory.mktemp("demo")
    return dpppl("demo", "--smoke", "--coverage-simulations", "2", "--out-dir", folder), folder


def test_demo_ends_with_a_summary_a_privacy_statement_and_a_report(demo):
    run, folder = demo
    assert run.returncode == 0, run.stderr
    assert "Posterior summary (ArviZ):" in run.stdout and "w[male]" in run.stdout
    assert "epsilon = 0.99" in run.stdout and "2000 records" in run.stdout
    assert "too small for a verdict" in run.stdout and "TARP coverage RMSE" in run.stdout
    result, report = folder / "result.nc", folder / "report.html"
    assert run.stdout.rstrip().endswith(f"Result:  {result}\nReport:  {report}")
    page = report.read_text()
    assert "SMOKE RUN" in page and "Coverage (TARP)" in page and "CC BY 4.0" in page


def test_demo_compares_the_private_posteriors_with_a_non_private_one_kept_out_of_the_result(demo):
    run, folder = demo
    why = run.stdout.split("Why noise-aware:")[1].splitlines()
    labels = ["naive (the result)", "naive (same release)", "NUTS (not private)"]
    assert why[1].split() == " ".join(labels).split()
    assert [line.split()[0] for line in why[2:7]] == [
        "intercept", "w[age]", "w[education-num]", "w[hours-per-week]", "w[male]",
    ]
    assert "NOT private, shown only because the sample is public" in run.stdout
    assert "naive (same release): its intervals hold the non-private mean for" in run.stdout
    page = (folder / "report.html").read_text()
    assert "Compared with other posteriors" in page and "NUTS (not private)" in page
    from dpppl.app.report import read_result

    assert set(read_result(folder / "result.nc").children) == {"posterior", "dpvi_trace", "tarp"}


@pytest.mark.slow
def test_the_full_demo_shows_the_point_in_about_a_minute_and_a_result_under_two_megabytes(
    tmp_path,
):
    run = dpppl("demo", "--out-dir", tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "result.nc").stat().st_size <= 2_000_000
    lines = run.stdout.splitlines()
    counts = {
        line.split(":")[0].strip(): int(line.split(" for ")[1].split(" of ")[0])
        for line in lines
        if "hold the non-private mean" in line
    }
    # The noise-aware intervals hold the non-private means at least as often as the naive ones.
    assert counts["noise-aware (the result)"] >= counts["naive (same release)"]
