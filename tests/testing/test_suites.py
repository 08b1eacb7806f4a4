"""The plugin-authoring kit: the example third-party plugin, installed from outside the core's
tree, is discovered, listed, usable and conformant; broken copies of it fail the conformance
suite with messages that say what to change.

The example is installed with ``pip install --target`` into a temporary folder put on
``sys.path``; its entry point is then loaded by the plugin manager's own entry-point scan (the
one ``dpppl`` runs at start-up), so discovery is tested the way a user's install is found.
Broken copies are subclasses registered with ``dpppl.plugin.registry.register_plugin`` (a plugin object
whose hook registers them), each under its own mechanism name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import dpppl
from dpppl.plugin.registry import (
    GROUP,
    get_plugin_manager,
    provider,
    register_plugin,
    registry,
    reset_registry,
    unregister_plugin,
)
from dpppl.privacy.events import GaussianEvent, PoissonSampledEvent
from dpppl.testing import (
    ConformanceError,
    accountant_checks,
    beta_bernoulli,
    check_accountant,
    check_mechanism,
    epsilon_lower_bound,
    exact_gaussian_epsilon,
    mechanism_checks,
)

EXAMPLE = Path(__file__).parents[2] / "tutorials" / "plugin_example" / "dpppl-bernstein-sheldon"
#: Fast settings of the example mechanism for the suite.
FAST = {"draws": 200, "oversampling": 10}


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory):
    """The example plugin pip-installed into a temporary folder on sys.path, and discovered."""
    root = tmp_path_factory.mktemp("example_plugin")
    source, target = root / "source", root / "site"
    # A copy, so that the build leaves nothing in the source tree.
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(target), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    get_plugin_manager().load_setuptools_entrypoints(GROUP)
    reset_registry()
    yield target
    unregister_plugin("bernstein_sheldon")
    sys.path.remove(str(target))
    for module in [m for m in sys.modules if m.startswith("dpppl_bernstein_sheldon")]:
        del sys.modules[module]
    importlib.invalidate_caches()


# -- the example plugin -----------------------------------------------------------------------------


def test_the_example_is_discovered_through_its_entry_point(example_plugin):
    cls = registry().mechanisms["bernstein_sheldon"]
    assert Path(sys.modules[cls.__module__].__file__).is_relative_to(example_plugin)
    assert provider("mechanism", "bernstein_sheldon") == "dpppl-bernstein-sheldon 0.1.0"


def test_dpppl_plugins_lists_the_example(example_plugin):
    run = subprocess.run(
        [Path(sys.executable).with_name("dpppl"), "plugins"],
        env={**os.environ, "PYTHONPATH": str(example_plugin)},
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert any(
        line.split()[:3] == ["bernstein_sheldon", "dpppl-bernstein-sheldon", "0.1.0"]
        for line in run.stdout.splitlines()
    ), run.stdout


def test_dpppl_sample_runs_the_example(example_plugin):
    with beta_bernoulli(np.random.default_rng(1)):
        result = dpppl.sample(
            mechanism="bernstein_sheldon", epsilon=1.0, delta=1e-5, random_seed=0,
            progressbar=False, **FAST,
        )  # fmt: skip
    p = result["posterior"]["p"].values
    assert p.shape == (1, FAST["draws"]) and np.all((p > 0) & (p < 1))
    assert set(result.children) == {"posterior", "noisy_sufficient_statistics"}
    assert result.attrs["dp_event"] == GaussianEvent(result.attrs["dp_noise_multiplier"]).to_json()
    assert 0.99 <= result.attrs["dp_epsilon"] <= 1.0


def test_the_example_passes_the_conformance_suite(example_plugin):
    report = check_mechanism("bernstein_sheldon", options=FAST)
    assert report.skipped == {}
    assert report.passed == [str(check) for check in mechanism_checks("bernstein_sheldon")]


# -- broken copies -----------------------------------------------------------------------------------


class _Plugin:
    """A plugin object whose hook registers one mechanism class."""

    def __init__(self, cls: type):
        self.cls = cls

    @dpppl.hookimpl
    def register_mechanisms(self, register):
        register(self.cls)


@pytest.fixture
def broken(example_plugin):
    """Registers a subclass of the example under a name of its own for one test."""
    registered = []

    def register(cls: type) -> str:
        register_plugin(_Plugin(cls), name=cls.name)
        registered.append(cls.name)
        return cls.name

    yield register
    for name in registered:
        unregister_plugin(name)


def _example():
    return registry().mechanisms["bernstein_sheldon"]


def test_a_copy_without_noise_releases_the_exact_statistic_and_fails(broken):
    class NoNoise(_example()):
        name = "broken_no_noise"

        def fit(self, model, data, plan, *, seed, progress):
            return super().fit(
                model, data, dataclasses.replace(plan, noise_multiplier=0.0),
                seed=seed, progress=progress,
            )  # fmt: skip

    broken(NoNoise)
    with pytest.raises(ConformanceError) as caught:
        check_mechanism("broken_no_noise", options=FAST)
    message = str(caught.value)
    assert caught.value.contract == "no leak of private data"
    assert "values of /noisy_sufficient_statistics/s" in message
    assert "the sum of record array 'y_data'" in message
    assert "What to change: release only noisy quantities" in message


def test_a_copy_without_noise_fails_the_statistical_check_of_the_declared_noise(broken):
    class NoNoise(_example()):
        name = "broken_no_noise_statistics"

        def fit(self, model, data, plan, *, seed, progress):
            release = super().fit(
                model, data, dataclasses.replace(plan, noise_multiplier=1e-12),
                seed=seed, progress=progress,
            )  # fmt: skip
            # Hide the statistic, so that only the noise test can see the missing noise.
            return dataclasses.replace(release, groups={})

    broken(NoNoise)
    checks = {str(c): c for c in mechanism_checks("broken_no_noise_statistics", options=FAST)}
    with pytest.raises(ConformanceError) as caught:
        checks["declared noise"]()
    message = str(caught.value)
    assert "[declared noise] mechanism 'broken_no_noise_statistics'" in message
    assert "told them apart in 30/30 fits on D and 30/30 on D′" in message
    assert "add the planned noise" in message


def test_a_copy_that_releases_observed_data_fails(broken):
    class LeaksObservedData(_example()):
        name = "broken_observed_data"

        def fit(self, model, data, plan, *, seed, progress):
            release = super().fit(model, data, plan, seed=seed, progress=progress)
            observed = {k: (("obs",), np.asarray(v)) for k, v in data.items()}
            release.groups["observed_data"] = xr.Dataset(observed)
            return release

    broken(LeaksObservedData)
    with pytest.raises(ConformanceError) as caught:
        check_mechanism("broken_observed_data", options=FAST)
    message = str(caught.value)
    assert caught.value.contract == "result layout"
    assert "dpppl refused the release" in message and "['observed_data']" in message
    assert "groups hold only what the guarantee covers" in message


def test_a_copy_that_puts_a_private_value_into_its_attributes_fails(broken):
    class LeaksIntoAttrs(_example()):
        name = "broken_attrs"

        def fit(self, model, data, plan, *, seed, progress):
            release = super().fit(model, data, plan, seed=seed, progress=progress)
            release.attrs["largest_value"] = float(np.max(data["y_data"]))
            return release

    broken(LeaksIntoAttrs)
    with pytest.raises(ConformanceError) as caught:
        check_mechanism("broken_attrs", options=FAST)
    message = str(caught.value)
    assert caught.value.contract == "no leak of private data"
    assert "attribute 'dp_mechanism_attrs' of /" in message
    assert "a value of record array 'y_data'" in message


def test_a_copy_that_declares_more_noise_than_it_adds_fails(broken):
    class WrongEvent(_example()):
        name = "broken_event"

        def privacy_event(self, *, n_records, noise_multiplier):
            return GaussianEvent(10 * noise_multiplier)

    broken(WrongEvent)
    with pytest.raises(ConformanceError) as caught:
        check_mechanism("broken_event", options=FAST)
    message = str(caught.value)
    assert caught.value.contract == "declared privacy event"
    assert "the event does not describe the noise the plan tells fit() to add" in message
    assert "return GaussianEvent(noise_multiplier)" in message


def test_a_copy_that_spends_delta_outside_its_event_without_calibrating_for_it_fails(broken):
    class UncountedExtraDelta(_example()):
        name = "broken_extra_delta"

        def plan(self, **kwargs):
            plan = super().plan(**kwargs)
            return dataclasses.replace(plan, extra_delta=plan.delta / 2)

    broken(UncountedExtraDelta)
    checks = {str(c): c for c in mechanism_checks("broken_extra_delta", options=FAST)}
    with pytest.raises(ConformanceError) as caught:
        checks["declared privacy event"]()
    assert "the plan's delta less its extra_delta" in str(caught.value)


def test_a_copy_that_ignores_the_seed_fails(broken):
    class FixedSeed(_example()):
        name = "broken_seed"

        def fit(self, model, data, plan, *, seed, progress):
            return super().fit(
                model, data, plan, seed=np.random.SeedSequence(0), progress=progress
            )

    broken(FixedSeed)
    checks = {str(c): c for c in mechanism_checks("broken_seed", options=FAST)}
    with pytest.raises(ConformanceError, match="fits with different seeds to release different"):
        checks["seeds respected"]()


def test_an_unregistered_class_is_refused_with_how_to_register_it(example_plugin):
    class Unregistered(_example()):
        name = "never_registered"

    with pytest.raises(ConformanceError) as caught:
        check_mechanism(Unregistered)
    assert caught.value.contract == "registration"
    assert "[project.entry-points.dpppl]" in str(caught.value)


# -- accountants -------------------------------------------------------------------------------------


@contextlib.contextmanager
def registered_accountant(cls):
    """``cls`` registered, as a plugin would register it, for the block."""

    class Plugin:
        @dpppl.hookimpl
        def register_accountants(self, register):
            register(cls)

    register_plugin(Plugin(), name=cls.name)
    try:
        yield
    finally:
        unregister_plugin(cls.name)


def test_an_accountant_that_underestimates_epsilon_fails():
    rdp = registry().accountants["rdp"]

    class Optimistic(rdp):
        name = "broken_optimistic"

        def epsilon(self, event, *, delta, relation):
            return 0.5 * super().epsilon(event, delta=delta, relation=relation)

    with registered_accountant(Optimistic), pytest.raises(ConformanceError) as caught:
        check_accountant("broken_optimistic", noise_multipliers=(1.0, 2.0))
    assert caught.value.contract == "upper bound on epsilon"
    assert "below the truth" in str(caught.value)


def test_an_accountant_exact_for_one_gaussian_but_optimistic_under_subsampling_fails():
    pld = registry().accountants["pld"]

    class Amplified(pld):
        """Claims 3 % more amplification by subsampling than there is."""

        name = "broken_amplified"

        def epsilon(self, event, *, delta, relation):
            exact = super().epsilon(event, delta=delta, relation=relation)
            sampled = isinstance(getattr(event, "event", None), PoissonSampledEvent)
            return 0.97 * exact if sampled else exact

    with registered_accountant(Amplified):
        checks = {str(c): c for c in accountant_checks("broken_amplified", noise_multipliers=(1.0, 2.0))}
        assert checks["upper bound on epsilon"]() is None
        with pytest.raises(ConformanceError, match="below the truth") as caught:
            checks["upper bound on subsampled epsilon"]()
    assert caught.value.contract == "upper bound on epsilon"


# -- the statistics ----------------------------------------------------------------------------------


def test_the_epsilon_lower_bound_sees_a_perfect_distinguisher_and_nothing_in_noise():
    rng = np.random.default_rng(0)
    assert epsilon_lower_bound(np.ones(30), np.zeros(30), 0.5, 1e-5) > 1.0
    same = epsilon_lower_bound(rng.normal(size=30), rng.normal(size=30), 0.0, 1e-5)
    assert same < 0.2


def test_the_exact_gaussian_epsilon_matches_the_analytic_mechanism():
    # ε of N(0, 1) noise on a sensitivity-1 release at δ = 1e-5 (Balle & Wang 2018): 4.3772.
    assert exact_gaussian_epsilon(1.0, 1e-5) == pytest.approx(4.377178, rel=1e-6)
