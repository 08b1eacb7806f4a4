"""Leak checks: fit on data holding recognisable values, then look for them everywhere a user or
an observer could see: the result's attributes, coordinates and non-released values, its netCDF
bytes, the HTML report, logs, warnings, printed output and the texts of errors.  None may appear.

The posterior and the mechanism groups the guarantee covers (DP-SGD traces, post-processing
draws) are DP releases and are not searched for values: a value there is noise, not a leak.  But
``observed_data``, ``constant_data`` and ``log_likelihood`` must be absent altogether.

Sentinels: a float with many recognisable digits, a large float, and a large integer count.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pymc as pm
import pytest
import xarray as xr

import dpppl
from dpppl.app.model_file import EXAMPLE_MODEL_FILE
from dpppl.engine import plan_fit, run_mechanism
from dpppl.errors import InexactReleaseError
from dpppl.plugin.registry import get_mechanism
from dpppl.privacy.subsampling import binomial_thresholds

FLOAT_SENTINEL = 7.123456789
#: The two large sentinels' digits run in no order: a serialised program holds index lists
#: 0, 1, 2, … as bytes, and one of 62 operands reads "0123456789" in ASCII, so 123456789 was
#: found in a program compiled from data without it (the likelihood model's Laplace fit, stop
#: 75); a reversed list would read 987654321.
BIG_SENTINEL = 978563412.5
COUNT_SENTINEL = 918273645
N = 40

#: Substrings that would betray a sentinel in any text (repr, str, %g, %.6g, %e formatting, and
#: the large one rounded to float32).
TEXT_MARKERS = ("7.12345", "7.12346", "978563412", "978563413", "978563392", "9.78563e+08",
                "9.785634e+08", "918273645", "9.18274e+08", "9.182736e+08")
#: Groups that are DP releases (or their post-processing): their values are not searched.
RELEASED = {"posterior", "dpvi_trace", "postprocessing_posterior", "postprocessing_sample_stats",
            "tarp"}
FORBIDDEN = {"observed_data", "constant_data", "log_likelihood", "predictions_constant_data",
             "prior_predictive", "posterior_predictive", "sample_stats_prior"}

NA_DPVI_FAST = {"steps": 200, "burn_in": 0.0, "tune": 50, "draws": 50, "chains": 1,
                "mc_draws": 2, "inference": "laplace"}
SWAG_PPM_FAST = {"warmup_epochs": 5, "swag_epochs": 5, "risk_draws": 50, "draws": 5,
                 "burn_in_epochs": 1, "batch_size": 10}


def sentinel_bytes() -> list[bytes]:
    """Every binary encoding of the sentinels that a netCDF/HDF5 file might hold."""
    encodings = []
    for value in (FLOAT_SENTINEL, BIG_SENTINEL, float(COUNT_SENTINEL)):
        for order in "<>":
            encodings.append(np.array(value, dtype=f"{order}f8").tobytes())
            encodings.append(np.array(value, dtype=f"{order}f4").tobytes())
    for order in "<>":
        encodings.append(np.array(COUNT_SENTINEL, dtype=f"{order}i8").tobytes())
    return encodings


def assert_no_sentinel_text(text: str, where: str) -> None:
    for marker in TEXT_MARKERS:
        assert marker not in text, f"a sentinel ({marker}) appears in {where}"


def assert_no_sentinel_bytes(content: bytes, where: str) -> None:
    for encoding in sentinel_bytes():
        assert encoding not in content, f"a sentinel's binary encoding appears in {where}"
    assert_no_sentinel_text(content.decode("latin-1"), where)


def _is_sentinel(values: np.ndarray) -> bool:
    if values.dtype.kind not in "iuf":
        return False
    values = values.astype(float)
    return bool(np.any(np.isclose(values, FLOAT_SENTINEL, rtol=1e-7, atol=0))
                or np.any(np.isclose(values, BIG_SENTINEL, rtol=1e-7, atol=0))
                or np.any(np.isclose(values, COUNT_SENTINEL, rtol=1e-7, atol=0)))


def assert_result_is_clean(result: xr.DataTree) -> None:
    """No forbidden group; no sentinel in any attribute, coordinate or non-released value."""
    groups = {node.name for node in result.subtree if node.name}
    assert not groups & FORBIDDEN, f"forbidden groups {groups & FORBIDDEN} in the result"
    for node in result.subtree:
        where = f"group {node.path!r}"
        assert_no_sentinel_text(repr(dict(node.attrs)), f"the attributes of {where}")
        dataset = node.to_dataset(inherit=False)
        for name, variable in dataset.variables.items():
            assert_no_sentinel_text(repr(dict(variable.attrs)), f"attributes of {name} in {where}")
            is_coord = name in dataset.coords
            if is_coord or node.name not in RELEASED:
                values = np.asarray(variable.values)
                assert not _is_sentinel(values), f"{name} in {where} holds a sentinel"
                if values.dtype.kind in "OUS":
                    assert_no_sentinel_text(repr(values.tolist()), f"{name} in {where}")


def sentinel_data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.normal(size=N)
    y = 1 + 2 * x + rng.normal(size=N)
    counts = rng.poisson(3, N).astype(np.int64)
    x[3], y[5], y[9], counts[11] = FLOAT_SENTINEL, BIG_SENTINEL, FLOAT_SENTINEL, COUNT_SENTINEL
    return x, y, counts


@pytest.fixture(scope="module")
def regression():
    """A regression with a count outcome beside it; covariate and outcomes hold sentinels."""
    x, y, counts = sentinel_data(np.random.default_rng(0))
    with pm.Model(coords={"obs": range(N)}) as model:
        X = pm.Data("X", x, dims="obs")
        intercept = pm.Normal("intercept", 0, 5)
        slope = pm.Normal("slope", 0, 5)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("y", intercept + slope * X, sigma, observed=y, dims="obs")
        pm.Poisson("count", pm.math.exp(intercept / 10), observed=counts, dims="obs")
    return model


@pytest.fixture(scope="module")
def location():
    """No covariates (a TARP study needs none): y ~ N(μ, σ) with sentinels among the y."""
    _, y, _ = sentinel_data(np.random.default_rng(1))
    with pm.Model(coords={"obs": range(N)}) as model:
        mu = pm.Normal("mu", 0, 5)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("y", mu, sigma, observed=y, dims="obs")
    return model


def observed_fit(model, capsys, caplog, tmp_path, **kwargs):
    """Fit with every channel captured; check the result, its netCDF and the channels."""
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with model:
            result = dpppl.sample(epsilon=1.0, delta=1e-3, progressbar=True, **kwargs)
    out, err = capsys.readouterr()
    assert_no_sentinel_text(out + err, "the printed output")
    assert_no_sentinel_text(caplog.text, "the logs")
    assert_no_sentinel_text("\n".join(str(w.message) for w in caught), "the warnings")
    assert_result_is_clean(result)
    path = tmp_path / "result.nc"
    result.to_netcdf(path)
    assert_no_sentinel_bytes(path.read_bytes(), "the netCDF file")
    assert_result_is_clean(xr.open_datatree(path))
    return result


def test_the_search_finds_a_sentinel_where_one_is_put(regression, tmp_path):
    """The checks have teeth: a result that does carry the data fails every one of them."""
    x = regression["X"].get_value()
    leaky = xr.DataTree.from_dict({
        "posterior": xr.Dataset({"a": ("draw", np.zeros(3))}),
        "constant_data": xr.Dataset({"X": ("obs", x)}),
    })
    with pytest.raises(AssertionError, match="forbidden"):
        assert_result_is_clean(leaky)
    sneaky = xr.DataTree.from_dict({"posterior": xr.Dataset({"a": ("draw", np.zeros(3))}),
                                    "diagnostics": xr.Dataset({"r": ("obs", x)})})
    with pytest.raises(AssertionError, match="holds a sentinel"):
        assert_result_is_clean(sneaky)
    sneaky["posterior"].attrs["note"] = f"largest y was {BIG_SENTINEL:g}"
    with pytest.raises(AssertionError, match="sentinel"):
        assert_result_is_clean(sneaky.drop_nodes("diagnostics"))
    path = tmp_path / "leaky.nc"
    leaky.to_netcdf(path)
    with pytest.raises(AssertionError, match="binary encoding"):
        assert_no_sentinel_bytes(path.read_bytes(), "the file")


@pytest.mark.parametrize("correlation_prior", ["lkj", "released"])
def test_na_dpvi_releases_no_data(regression, capsys, caplog, tmp_path, correlation_prior):
    observed_fit(regression, capsys, caplog, tmp_path, mechanism="na-dpvi",
                 correlation_prior=correlation_prior, **NA_DPVI_FAST)


def test_swag_ppm_releases_no_data(regression, capsys, caplog, tmp_path):
    observed_fit(regression, capsys, caplog, tmp_path, mechanism="swag-ppm", **SWAG_PPM_FAST)


def test_dp_sep_releases_no_data(location, capsys, caplog, tmp_path):
    observed_fit(location, capsys, caplog, tmp_path, mechanism="dp-sep")


def test_a_fit_with_a_tarp_study_releases_no_data(location, capsys, caplog, tmp_path):
    result = observed_fit(
        location, capsys, caplog, tmp_path, mechanism="na-dpvi",
        tarp={"n_simulations": 4, "n_workers": 1, "n_repeats": 2, "random_seed": 0},
        **{**NA_DPVI_FAST, "posterior": "naive"},
    )
    assert "tarp" in result.children


def test_a_tarp_study_releases_no_data(location, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = dpppl.tarp(location, mechanism="na-dpvi", epsilon=1.0, delta=1e-3,
                           n_simulations=4, n_workers=1, n_repeats=2, random_seed=0,
                           progressbar=True, **{**NA_DPVI_FAST, "posterior": "naive"})
    out, err = capsys.readouterr()
    for text, where in ((out + err, "printed output"), (caplog.text, "logs"),
                        ("\n".join(str(w.message) for w in caught), "warnings")):
        assert_no_sentinel_text(text, where)
    assert_result_is_clean(xr.DataTree(study))


# -- refusals: error messages name variables and settings, never values ---------------------------


def _refusal_text(model, **kwargs) -> str:
    with pytest.raises(dpppl.DPPPLError) as error:
        with model:
            dpppl.sample(epsilon=1.0, delta=1e-3, progressbar=False, **kwargs)
    return "".join(map(str, (error.value, error.value.__cause__, error.value.__context__)))


def test_errors_about_the_data_quote_no_value():
    x, y, _ = sentinel_data(np.random.default_rng(2))
    x[0] = np.inf
    with pm.Model(coords={"obs": range(N)}) as model:
        X = pm.Data("X", x, dims="obs")
        slope = pm.Normal("slope", 0, 5)
        pm.Normal("y", slope * X, 1, observed=y, dims="obs")
    text = _refusal_text(model, mechanism="na-dpvi", **NA_DPVI_FAST)
    assert "infinite" in text
    assert_no_sentinel_text(text, "the error message")


def test_errors_about_the_model_quote_no_value():
    x, y, _ = sentinel_data(np.random.default_rng(3))
    with pm.Model(coords={"obs": range(N)}) as model:
        X = pm.Data("X", x, dims="obs")
        per_record = pm.Normal("z", 0, 1, dims="obs")
        pm.Normal("y", per_record * X, 1, observed=y, dims="obs")
    text = _refusal_text(model, mechanism="na-dpvi", **NA_DPVI_FAST)
    assert "record" in text
    assert_no_sentinel_text(text, "the error message")


def test_a_snapped_release_out_of_float64_range_is_refused_without_quoting_a_value(regression):
    """The real fit with its plan's grid forced far too fine: every sum leaves float64's exact
    range, the fit stops before returning anything, and the error names no value."""
    compiled = dpppl.record_model(regression)
    mechanism = get_mechanism("na-dpvi")(**NA_DPVI_FAST)
    plan, _ = plan_fit(mechanism, compiled, epsilon=1.0, delta=1e-3)
    fine = dataclasses.replace(plan, details={**plan.details, "grid": 2.0**-80})
    with pytest.raises(InexactReleaseError) as error:
        run_mechanism(mechanism, compiled, compiled.data(), fine, progressbar=False)
    assert "float64" in str(error.value)
    assert_no_sentinel_text(str(error.value), "the error message")


# -- the command line -----------------------------------------------------------------------------


def _run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpppl.app.cli", *args], check=False,
                          capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The documented example model with a CSV whose rows hold the sentinels."""
    folder = tmp_path_factory.mktemp("leak_project")
    (folder / "model.py").write_text(EXAMPLE_MODEL_FILE)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 2))
    x[4, 0], x[8, 1] = FLOAT_SENTINEL, BIG_SENTINEL
    y = rng.binomial(1, 0.5, 300)
    rows = [f"{float(a)!r},{float(b)!r},{c}" for (a, b), c in zip(x, y, strict=True)]
    (folder / "data.csv").write_text("x1,x2,y\n" + "\n".join(rows) + "\n")
    return folder


def test_the_command_line_fit_releases_no_data(project):
    run = _run_cli("fit", "model.py", "--data", "data.csv", "--mechanism", "na-dpvi",
                   "--epsilon", "1", "--delta", "1e-5", "--out", "out/result.nc",
                   "--report", "out/report.html", "--option", "steps=100",
                   "--option", "posterior=naive", "--option", "chains=1", cwd=project)
    assert run.returncode == 0, run.stderr
    assert_no_sentinel_text(run.stdout + run.stderr, "the command's output")
    assert_no_sentinel_bytes((project / "out/result.nc").read_bytes(), "the saved result")
    assert_no_sentinel_text((project / "out/report.html").read_text(), "the HTML report")
    assert_result_is_clean(xr.open_datatree(project / "out/result.nc"))


def test_the_command_line_refuses_bad_data_without_quoting_it(project, tmp_path):
    (tmp_path / "model.py").write_text(EXAMPLE_MODEL_FILE)
    text = (project / "data.csv").read_text().replace("\n1,", "\nnan,", 1)
    text = text.replace(repr(FLOAT_SENTINEL), f"{FLOAT_SENTINEL!r}x")  # not a number
    (tmp_path / "data.csv").write_text(text)
    run = _run_cli("fit", "model.py", "--data", "data.csv", "--mechanism", "na-dpvi",
                   "--epsilon", "1", "--delta", "1e-5", "--out", "out/result.nc", cwd=tmp_path)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert_no_sentinel_text(run.stdout + run.stderr, "the command's error output")


_FIT_IN_A_NEW_PROCESS = """
import numpy as np, pymc as pm, dpppl
x, y, counts = {data}
with pm.Model(coords={{"obs": range(len(x))}}) as model:
    X = pm.Data("X", np.array(x), dims="obs")
    intercept = pm.Normal("intercept", 0, 5)
    slope = pm.Normal("slope", 0, 5)
    sigma = pm.HalfNormal("sigma", 2)
    pm.Normal("y", intercept + slope * X, sigma, observed=np.array(y), dims="obs")
    pm.Poisson("count", pm.math.exp(intercept / 10), observed=np.array(counts), dims="obs")
    dpppl.sample(mechanism={mechanism!r}, epsilon=1.0, delta=1e-5, progressbar=False, **{options})
"""


@pytest.mark.parametrize(("mechanism", "options"), [
    ("na-dpvi", NA_DPVI_FAST), ("dp-sep", {"passes": 2}), ("swag-ppm", SWAG_PPM_FAST),
])
def test_compiled_programs_and_generated_source_hold_no_record_value(tmp_path, mechanism, options):
    """Compiled programs are kept on disk between processes, and so is the Python source PyTensor
    generates for each compiled graph, its constants quoted in the comments: record data must be
    inputs of every compiled function, never constants baked into one."""
    x, y, counts = sentinel_data(np.random.default_rng(0))
    data = (x.tolist(), y.tolist(), counts.tolist())
    script = _FIT_IN_A_NEW_PROCESS.format(data=data, mechanism=mechanism, options=options)
    cache = tmp_path / "compilation"
    done, written = _run_and_collect_written_files(
        script, tmp_path, DPPPL_COMPILATION_CACHE=str(cache)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    entries = _compilation_cache_entries(cache)
    assert entries, "the fit wrote no compiled program to the cache"
    for name, content in entries.items():
        assert_no_sentinel_bytes(content, f"the compilation cache entry {name}")
    assert any(name.endswith(".py") for name in written), "the fit wrote no generated source"
    for name, content in written.items():
        assert_no_sentinel_bytes(content, f"the file {name}")


def test_the_generated_source_search_finds_a_constant_baked_into_a_graph(tmp_path):
    """The search above is not blind: a graph that holds the data as a constant quotes it in the
    source PyTensor generates (a product with an input, which constant folding cannot fold away)."""
    script = (
        "import numpy as np, pytensor.tensor as pt\n"
        "from dpppl.model.jax_compile import jaxify\n"
        "t = pt.dvector('t')\n"
        f"data = pt.constant(np.array([{FLOAT_SENTINEL!r}, 1.0, 2.0]))\n"
        "jaxify([t], [data * t])(np.ones(3))\n"
    )
    done, written = _run_and_collect_written_files(script, tmp_path, DPPPL_COMPILATION_CACHE="off")
    assert done.returncode == 0, done.stderr[-2000:]
    with pytest.raises(AssertionError, match="sentinel"):
        for name, content in written.items():
            assert_no_sentinel_bytes(content, name)


def _run_and_collect_written_files(
    script: str, tmp_path: Path, **env: str
) -> tuple[subprocess.CompletedProcess, dict[str, bytes]]:
    """Run ``script`` in a new process and read every file it left in the temporary folder or the
    user cache folder."""
    temp, user_cache = tmp_path / "temp", tmp_path / "user_cache"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True,
        env={**os.environ, "TMPDIR": str(temp), "XDG_CACHE_HOME": str(user_cache), **env},
    )
    written = {str(path.relative_to(tmp_path)): path.read_bytes()
               for folder in (temp, user_cache) for path in folder.rglob("*") if path.is_file()}
    return done, written


_COUNTED_FIT_IN_A_NEW_PROCESS = """
import json, numpy as np, pymc as pm, dpppl
with pm.Model() as model:
    p = pm.Beta("p", 1, 1)
    pm.Bernoulli("y", p=p, observed=np.array({y}))
    idata = dpppl.sample(mechanism="na-dpvi", epsilon=1.0, delta=1e-5, progressbar=False, **{options})
print(json.dumps(json.loads(idata.attrs["dp_privacy_details"])))
"""


def test_a_fit_that_counts_records_keeps_the_counts_out_of_the_compilation_cache(tmp_path):
    """A binary model's DP-SGD draws each step's count of ones from thresholds computed from the
    data's number of ones (private): those must be inputs of the compiled program too."""
    y = (np.random.default_rng(1).random(373) < 0.37).astype(int)
    script = _COUNTED_FIT_IN_A_NEW_PROCESS.format(y=y.tolist(), options=NA_DPVI_FAST)
    cache = tmp_path / "compilation"
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True,
                          text=True, env={**os.environ, "DPPPL_COMPILATION_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    details = json.loads(done.stdout.strip().splitlines()[-1])
    assert details["count_length"] is not None, "the fit did not count records"
    ones = int(y.sum())
    high = binomial_thresholds(ones, details["sampling_rate"], details["count_length"])[0]
    # The high words between the tails are 64-bit patterns no program holds by chance.
    telling = [w.tobytes() for w in high if 2**32 < w < 2**64 - 2**32]
    assert len(telling) > 5
    entries = _compilation_cache_entries(cache)
    assert entries, "the fit wrote no compiled program to the cache"
    for name, content in entries.items():
        assert not any(word in content for word in telling), f"a count's threshold is in {name}"


def test_the_compilation_cache_search_finds_a_constant_baked_into_a_program(tmp_path):
    """The search above is not blind: a function that closes over the data does leak into it."""
    script = (
        # dpppl.model.jax_compile turns on 64-bit JAX and the persistent cache (``import dpppl`` is lazy).
        "import jax, jax.numpy as jnp, dpppl.model.jax_compile\n"
        f"data = jnp.array([{FLOAT_SENTINEL!r}, 1.0, 2.0, 3.0])\n"
        "jax.jit(lambda t: jnp.sum(data * t))(2.0).block_until_ready()\n"
    )
    cache = tmp_path / "compilation"
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                   env={**os.environ, "DPPPL_COMPILATION_CACHE": str(cache)})
    with pytest.raises(AssertionError, match="sentinel"):
        for name, content in _compilation_cache_entries(cache).items():
            assert_no_sentinel_bytes(content, name)


def _compilation_cache_entries(cache: Path) -> dict[str, bytes]:
    """The serialised programs in a JAX compilation cache, decompressed (JAX stores them
    compressed, so the raw files would hide any constant)."""
    compilation_cache = pytest.importorskip(
        "jax._src.compilation_cache", reason="reads JAX's own cache format"
    )
    return {
        path.name: compilation_cache.decompress_executable(path.read_bytes())
        for path in cache.rglob("*-cache")
    }
