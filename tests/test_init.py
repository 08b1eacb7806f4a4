"""The ``dpppl`` package: its public names load on first use, so importing it is instant."""

from __future__ import annotations

import json
import subprocess
import sys

import dpppl

#: Libraries that take seconds to import; ``import dpppl`` and ``dpppl --help`` need none of them.
HEAVY = ("pymc", "pytensor", "jax", "arviz", "arviz_base", "xarray", "matplotlib", "pandas")


def imported_after(code: str) -> list[str]:
    """The heavy libraries a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    run = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120
    )
    return json.loads(run.stdout.splitlines()[-1])


def test_importing_dpppl_loads_no_heavy_library():
    assert imported_after("import dpppl") == []


def test_building_the_command_line_parser_loads_no_heavy_library():
    assert imported_after("import dpppl.app.cli; dpppl.app.cli.build_parser()") == []


def test_every_public_name_resolves():
    missing = [name for name in dpppl.__all__ if not hasattr(dpppl, name)]
    assert missing == []
    assert set(dpppl.__all__) <= set(dir(dpppl))


def test_record_model_stays_the_function_once_its_module_is_imported():
    import dpppl.model.record_model  # noqa: F401 - binds the submodule on dpppl.model, as imports do

    assert callable(dpppl.record_model) and dpppl.record_model.__name__ == "record_model"
    assert dpppl.RecordModel.__module__ == "dpppl.model.record_model"


def test_the_plugin_face_loads_no_heavy_library_until_a_name_is_read():
    assert imported_after("import dpppl.plugin; from dpppl.plugin import hookimpl, Mechanism") == []
    assert "jax" in imported_after("from dpppl.plugin import RecordModel")


def test_every_name_of_the_plugin_face_resolves():
    import dpppl.plugin

    missing = [name for name in dpppl.plugin.__all__ if not hasattr(dpppl.plugin, name)]
    assert missing == []
    assert set(dpppl.plugin.__all__) <= set(dir(dpppl.plugin))
