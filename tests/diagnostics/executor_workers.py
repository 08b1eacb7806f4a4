"""What a worker process of ``tests/diagnostics/test_executors.py`` reports of itself.

A plain module, not part of the test file: pytest imports test files by path (importlib mode)
and processes started with ``spawn`` cannot import them again.
"""

from __future__ import annotations

import os
from typing import Any


def cpus_of_this_worker(barrier: Any, chunk: list) -> tuple[int, list[set[int]], str | None]:
    """Wait at ``barrier`` until every worker holds a chunk, then return this process's id, the
    CPUs each of its threads may run on, and the BLAS thread count it gives libraries it loads."""
    barrier.wait(timeout=120)
    threads = [os.sched_getaffinity(int(thread)) for thread in os.listdir("/proc/self/task")]
    return os.getpid(), threads, os.environ.get("OPENBLAS_NUM_THREADS")
