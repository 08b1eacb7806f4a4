"""Fits use one BLAS thread, and a pinned process runs every one of its threads on its CPUs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from dpppl.threads import BLAS_THREAD_VARIABLES, single_threaded_blas


def blas_threads() -> list[int]:
    return [
        library["num_threads"] for library in threadpool_info() if library["user_api"] == "blas"
    ]


def test_a_block_runs_on_one_blas_thread_and_the_libraries_get_theirs_back():
    np.linalg.cholesky(np.eye(3))  # NumPy's BLAS is loaded
    before = blas_threads()
    assert before
    with single_threaded_blas():
        assert blas_threads() == [1] * len(before)
    assert blas_threads() == before


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="this platform cannot pin")
def test_pinning_a_process_pins_the_threads_its_imports_started():
    cpu = min(os.sched_getaffinity(0))
    script = f"""
import os
import numpy as np  # starts OpenBLAS's threads where there are CPUs for them
from dpppl.threads import pin_process
pin_process({{{cpu}}})
print(sorted({{cpu for t in os.listdir("/proc/self/task") for cpu in os.sched_getaffinity(int(t))}}))
print(len(os.listdir("/proc/self/task")), os.environ["OPENBLAS_NUM_THREADS"])
"""
    # Without the variables that would size BLAS before the pinning (importing Dask sets them).
    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    ).stdout.split("\n")
    assert out[0] == f"[{cpu}]"
    threads, blas = out[1].split()
    assert blas == "1"
    # OpenBLAS started threads before the pinning, on a machine with CPUs for them.
    assert int(threads) > 1 or len(os.sched_getaffinity(0)) == 1
