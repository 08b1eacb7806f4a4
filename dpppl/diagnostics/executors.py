"""Running independent replicates in chunks: in this process, on local processes, or on Dask.

Simulation studies (TARP) repeat one simulate-and-fit step many times with independent seeds.
:func:`map_chunks` splits the replicates into chunks, runs them where the user asked, advances a
progress bar as chunks finish and returns the results in chunk order, so a study gives the same
numbers on every executor.

Local processes are started with ``spawn``: JAX's thread pools do not survive ``fork``.  As with
any ``spawn`` pool, a script that starts one must guard its entry point with
``if __name__ == "__main__":``.  Each process is pinned to its own share of this process's CPUs
(:func:`cpu_shares`), as ``mpirun`` pins its ranks: XLA sizes its CPU thread pool to the CPUs a
process may use, and pools that each claim every CPU spin while they wait for one another.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

import jax

from dpppl.progress import Progress
from dpppl.threads import pin_process

Result = TypeVar("Result")

#: Chunks per worker: enough to balance uneven replicates and move the bar, few enough that the
#: per-chunk cost (shipping the task, returning the draws) stays small.
CHUNKS_PER_WORKER = 4


def default_workers() -> int:
    """The CPUs this process may use; 1 when JAX computes on an accelerator.

    One process owns a GPU and keeps it busy with vectorised batches; worker processes would
    each claim most of its memory at start and fail.
    """
    if jax.default_backend() != "cpu":
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_shares(workers: int) -> list[set[int]]:
    """The CPUs each of ``workers`` local processes is pinned to: this process's CPUs in
    contiguous, nearly equal, disjoint shares, dealt out again from the first where there are
    more workers than CPUs.  Empty where the platform cannot pin a process (not Linux).

    Unpinned, the thread pools of every worker (XLA's, OpenBLAS's) claim every CPU, and their
    threads spin while they wait for threads that another worker has descheduled (see
    :mod:`dpppl.threads`).
    """
    if not hasattr(os, "sched_setaffinity"):
        return []
    shares = [set(share) for share in split(sorted(os.sched_getaffinity(0)), workers)]
    return [shares[i % len(shares)] for i in range(workers)]


def _pin(shares: Any) -> None:
    """Pin this worker process to the next CPU share in the queue ``shares``, before JAX starts
    its backend here (the pool's initializer runs before the first task is unpickled)."""
    pin_process(shares.get())


def check_executor(client: Any, n_workers: int | None) -> None:
    """Refuse a contradictory or invalid choice of executor before any work starts."""
    if client is not None and n_workers is not None:
        raise ValueError(
            "give either client= (a dask.distributed Client: the cluster decides the workers) "
            "or n_workers= (local processes), not both"
        )
    if n_workers is None:
        return
    if isinstance(n_workers, bool) or int(n_workers) != n_workers or n_workers < 1:
        raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")


def split(items: Sequence, n_chunks: int) -> list[list]:
    """``items`` in at most ``n_chunks`` contiguous chunks of nearly equal size, in order."""
    n_chunks = max(1, min(n_chunks, len(items)))
    bounds = [round(i * len(items) / n_chunks) for i in range(n_chunks + 1)]
    return [list(items[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def map_chunks(
    items: Sequence,
    *,
    batch: int = 1,
    local: Callable[[list], Result],
    remote: Callable[[list], Result],
    client: Any = None,
    n_workers: int | None = None,
    progressbar: bool = True,
    description: str = "replicates",
) -> list[Result]:
    """Apply a function to chunks of ``items`` and return the results in chunk order.

    Parameters
    ----------
    items
        The replicates (for example their seeds); the bar counts them.
    batch
        How many replicates the computation runs at once (a vectorised fit's batch).  Above 1,
        every executor cuts the same chunks, consecutive groups of this size, so that numbers
        which depend on how replicates are grouped (a vectorised random stream) do not depend
        on where the study runs.
    local
        The function to run in this process (``n_workers=1``): it may hold compiled objects.
    remote
        The same computation as a picklable callable (a top-level function, or a
        ``functools.partial`` of one with picklable arguments), for worker processes.
    client
        A ``dask.distributed.Client``: chunks run on its cluster.
    n_workers
        Local worker processes when no client is given (default: the CPUs available); 1 runs
        everything in this process.
    progressbar
        Show a bar that advances as chunks finish.
    description
        The bar's label.

    Returns
    -------
    list
        One result per chunk, in the order of the chunks.
    """
    check_executor(client, n_workers)
    if client is not None:
        workers = sum(client.nthreads().values())
    else:
        workers = default_workers() if n_workers is None else int(n_workers)
    in_process = client is None and workers == 1
    if batch > 1:
        chunks = [list(items[i : i + batch]) for i in range(0, len(items), batch)]
    else:
        chunks = split(items, len(items) if in_process else workers * CHUNKS_PER_WORKER)
    with Progress(progressbar).task(description, total=len(items)) as bar:
        if in_process:
            results = []
            for chunk in chunks:
                results.append(local(chunk))
                bar.advance(len(chunk))
            return results
        if client is not None:
            return _on_dask(client, remote, chunks, bar)
        return _on_processes(remote, chunks, workers, bar)


def _on_processes(remote: Callable, chunks: list[list], workers: int, bar) -> list:
    context = multiprocessing.get_context("spawn")
    workers = min(workers, len(chunks))
    pinning: dict[str, Any] = {}
    if shares := cpu_shares(workers):
        queue = context.Queue()
        for share in shares:
            queue.put(share)
        pinning = {"initializer": _pin, "initargs": (queue,)}
    results: list = [None] * len(chunks)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, **pinning) as pool:
        futures = {pool.submit(remote, chunk): i for i, chunk in enumerate(chunks)}
        try:
            for future in as_completed(futures):
                index = futures[future]
                results[index] = future.result()
                bar.advance(len(chunks[index]))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return results


def _on_dask(client: Any, remote: Callable, chunks: list[list], bar) -> list:
    from distributed import as_completed as dask_completed

    # pure=False: equal chunks of a repeated study must run again, not come from Dask's cache.
    futures = client.map(remote, chunks, pure=False)
    index = {future.key: i for i, future in enumerate(futures)}
    results: list = [None] * len(chunks)
    try:
        for future in dask_completed(futures):
            i = index[future.key]
            results[i] = future.result()
            bar.advance(len(chunks[i]))
    except BaseException:
        client.cancel(futures)
        raise
    return results
