"""How fits use a CPU's threads: single-threaded BLAS inside a fit, and worker processes pinned
to their own CPUs.

JAX computes linear algebra on a CPU (Cholesky factors, triangular solves) by calling the LAPACK
that SciPy ships, an OpenBLAS whose worker threads spin while they wait for the next call.  A
sampler calls it on small matrices at every gradient, so its threads gain nothing and spin
between calls; where two processes share the CPUs, each spins while the other's threads hold
them.  NA-DPVI's post-processing NUTS on 36 parameters (2026-12-04, 2 CPUs,
``tutorials/RESULTS.md``) took 5.6 wall seconds and 11.8 CPU-seconds alone with OpenBLAS's
default threads, 5.2 and 5.2 with one, and 79 CPU-seconds each when two such processes ran at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from threadpoolctl import threadpool_limits

#: Environment variables that size a BLAS library's threads when it is loaded.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run the block with every loaded BLAS library on one thread, as a fit runs (see the module
    docstring); the libraries' own thread counts come back after it."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def pin_process(cpus: set[int]) -> None:
    """Pin this process, every thread it has started so far (BLAS servers started on import)
    included, to ``cpus``, and size the BLAS libraries it loads from now on to them.

    For a worker process of a study, before JAX starts its backend there: XLA sizes its CPU
    thread pool to the CPUs the process may use, as an ``mpirun`` rank pinned to its cores does.
    """
    for thread in os.listdir("/proc/self/task"):
        # A thread may end between the listing and its pinning.
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(thread), cpus)
    os.environ.update(dict.fromkeys(BLAS_THREAD_VARIABLES, str(len(cpus))))
