"""What is installed: ``dpppl.mechanisms()`` and ``dpppl.accountants()``, and the listing that lets a
new process answer without loading the plugins."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dpppl
from dpppl.plugin.registry import PluginInfo, register_plugin, unregister_plugin

#: A third-party mechanism plugin, installed below as a real distribution (a dist-info folder with
#: its entry point) on a folder put on the path of a fresh interpreter.
PROBE_PLUGIN = '''\
from dataclasses import dataclass

import dpppl
from dpppl.plugin.mechanism import Mechanism


class Probe(Mechanism):
    name = "probe"
    description = "{description}"

    @dataclass(frozen=True)
    class Options:
        rounds: int = 3
        label: str | None = None

    def fit(self, model, data, plan, *, seed, progress):
        raise NotImplementedError("listed, never fitted")


@dpppl.hookimpl
def register_mechanisms(register):
    register(Probe)
'''

#: What a fresh interpreter reports: the mechanisms it lists, and whether it loaded the plugin.
LIST = textwrap.dedent(
    """\
    import dataclasses, json, sys
    import dpppl
    listing = {name: dataclasses.asdict(info) for name, info in dpppl.mechanisms().items()}
    print(json.dumps({"listing": listing, "loaded": "dpppl_probe.plugin" in sys.modules}))
    """
)


@pytest.fixture
def probe(tmp_path) -> Path:
    """A folder holding the installed ``dpppl-probe`` 0.3 distribution; returns its plugin.py."""
    site = tmp_path / "site"
    info = site / "dpppl_probe-0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dpppl-probe\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[dpppl]\nprobe = dpppl_probe.plugin\n")
    package = site / "dpppl_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(PROBE_PLUGIN.format(description="counts to three"))
    return package / "plugin.py"


def list_in_a_new_process(site: Path, cache: Path) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "DPPPL_LOAD_PLUGINS": "dpppl-probe",
        "XDG_CACHE_HOME": str(cache),
    }
    run = subprocess.run(
        [sys.executable, "-c", LIST], env=env, check=True, capture_output=True, text=True,
        timeout=120,
    )
    return json.loads(run.stdout)


def test_a_new_process_lists_the_plugins_from_the_stored_listing_until_a_plugin_changes(
    probe, tmp_path
):
    site, cache = probe.parents[1], tmp_path / "cache"
    first = list_in_a_new_process(site, cache)
    assert first["loaded"] is True
    assert first["listing"] == {
        "probe": {
            "kind": "mechanism",
            "name": "probe",
            "description": "counts to three",
            "options": {"rounds": 3, "label": None},
            "distribution": "dpppl-probe",
            "version": "0.3",
        }
    }
    again = list_in_a_new_process(site, cache)
    assert again == {"listing": first["listing"], "loaded": False}

    probe.write_text(PROBE_PLUGIN.format(description="counts to four"))
    edited = list_in_a_new_process(site, cache)
    assert edited["loaded"] is True
    assert edited["listing"]["probe"]["description"] == "counts to four"


def test_the_built_in_mechanisms_are_listed_with_their_options_and_distribution(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    na_dpvi = dpppl.mechanisms()["na-dpvi"]
    assert (na_dpvi.kind, na_dpvi.distribution, na_dpvi.version) == (
        "mechanism", "dpppl-na-dpvi", "0.1.0",
    )
    options = dpppl.plugin.registry.get_mechanism("na-dpvi").Options
    assert na_dpvi.options == {f.name: f.default for f in dataclasses.fields(options)}
    assert na_dpvi.description == dpppl.plugin.registry.get_mechanism("na-dpvi").description
    assert {"dp-sep", "swag-ppm"} <= set(dpppl.mechanisms())


def test_accountants_are_listed_with_their_distribution_and_no_options(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    listed = dpppl.accountants()
    assert {name: listed[name].distribution for name in ("pld", "rdp", "prv")} == {
        "pld": "dpppl-dp-accounting", "rdp": "dpppl-dp-accounting", "prv": "dpppl-prv",
    }
    assert all(info.options == {} and info.kind == "accountant" for info in listed.values())


def test_a_plugin_registered_by_hand_is_listed_by_its_module():
    class HandMade(dpppl.Mechanism):
        name = "hand-made"
        description = "registered from a notebook"

        def fit(self, model, data, plan, *, seed, progress):
            raise NotImplementedError("listed, never fitted")

    class Plugin:
        @staticmethod
        @dpppl.hookimpl
        def register_mechanisms(register):
            register(HandMade)

    register_plugin(Plugin(), name="hand-made")
    try:
        assert dpppl.mechanisms()["hand-made"] == PluginInfo(
            kind="mechanism", name="hand-made", description="registered from a notebook",
            options={}, distribution=__name__, version="unknown",
        )
    finally:
        unregister_plugin("hand-made")
    assert "hand-made" not in dpppl.mechanisms()
