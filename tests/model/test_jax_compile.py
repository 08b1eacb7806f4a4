"""Where compilation leaves files: the compiled programs and PyTensor's generated source."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytensor

from dpppl.model.jax_compile import keep_generated_source

_COMPILE_ONE_STRUCTURE_THREE_TIMES = """
import numpy as np, pytensor, pytensor.tensor as pt
from dpppl.model.jax_compile import jaxify
t = pt.dvector("t")
for _ in range(3):
    jaxify([t], [t * 2.5 + 1.0])(np.ones(3))
print(pytensor.config.generated_src_dir)
"""


def _compile_in_a_new_process(tmp_path: Path, **env: str) -> tuple[str, Path, Path]:
    temp, cache = tmp_path / "temp", tmp_path / "cache"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_ONE_STRUCTURE_THREE_TIMES], check=True, text=True,
        capture_output=True,
        env={**os.environ, "TMPDIR": str(temp), "XDG_CACHE_HOME": str(cache),
             "DPPPL_COMPILATION_CACHE": "off", **env},
    )
    return done.stdout.strip(), temp, cache


def test_generated_source_is_kept_once_per_structure_in_the_user_cache(tmp_path):
    folder, temp, cache = _compile_in_a_new_process(tmp_path)
    assert Path(folder) == cache / "dpppl" / "generated_source"
    assert len(list(Path(folder).glob("*.py"))) == 1
    assert not list(temp.iterdir()), "PyTensor still wrote source to the temporary folder"


def test_a_generated_source_folder_the_user_chose_is_kept(tmp_path):
    chosen = tmp_path / "mine"
    folder, _, cache = _compile_in_a_new_process(
        tmp_path, PYTENSOR_FLAGS=f"generated_src_dir={chosen}"
    )
    assert Path(folder) == chosen
    assert len(list(chosen.glob("*.py"))) == 1
    assert not (cache / "dpppl" / "generated_source").exists()


def test_keep_generated_source_creates_the_folder_it_is_given_and_points_pytensor_there(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(pytensor.config, "generated_src_dir", "")
    chosen = tmp_path / "new" / "source"
    assert keep_generated_source(chosen) == chosen
    assert chosen.is_dir()
    assert pytensor.config.generated_src_dir == str(chosen)
    # Once set, the folder in use is kept and reported.
    assert keep_generated_source(tmp_path / "other") == chosen


def test_a_folder_that_cannot_be_created_leaves_pytensor_on_temporary_files(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(pytensor.config, "generated_src_dir", "")
    blocker = tmp_path / "a file"
    blocker.write_text("")
    assert keep_generated_source(blocker / "source") is None
    assert pytensor.config.generated_src_dir == ""
