"""Chunked replicates: split in order, run in this process with a bar, executor choice checked."""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
from pathlib import Path

import jax
import pytest

from dpppl.diagnostics import executors
from dpppl.diagnostics.executors import (
    check_executor,
    cpu_shares,
    default_workers,
    map_chunks,
    split,
)

pinnable = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="this platform cannot pin a process to CPUs"
)


@pytest.mark.parametrize(("n_items", "n_chunks"), [(10, 3), (3, 10), (12, 4), (1, 1)])
def test_split_keeps_every_item_in_order_in_nearly_equal_chunks(n_items, n_chunks):
    chunks = split(list(range(n_items)), n_chunks)
    assert [item for chunk in chunks for item in chunk] == list(range(n_items))
    assert len(chunks) == min(n_items, n_chunks)
    assert max(map(len, chunks)) - min(map(len, chunks)) <= 1


def test_one_worker_runs_each_item_in_this_process_in_order():
    calls = []

    def local(chunk):
        calls.append(chunk)
        return sum(chunk)

    def remote(chunk):  # pragma: no cover - must not run
        raise AssertionError("n_workers=1 must not start worker processes")

    results = map_chunks(range(5), local=local, remote=remote, n_workers=1, progressbar=True)
    assert results == [0, 1, 2, 3, 4] and calls == [[0], [1], [2], [3], [4]]


def test_by_default_a_cpu_study_uses_every_cpu_this_process_may_use():
    assert jax.default_backend() == "cpu"
    assert default_workers() == len(os.sched_getaffinity(0))


def test_by_default_a_gpu_study_runs_in_the_one_process_that_owns_the_gpu(monkeypatch):
    # No GPU here (CI has none): the backend JAX reports is replaced.  On an H200, the default
    # of 16 spawned workers would each claim most of the GPU's memory at start.
    monkeypatch.setattr(executors.jax, "default_backend", lambda: "gpu")
    assert default_workers() == 1

    def remote(chunk):  # pragma: no cover - must not run
        raise AssertionError("a GPU study must not start worker processes by default")

    assert map_chunks(range(3), local=sum, remote=remote, progressbar=False) == [0, 1, 2]


@pytest.mark.parametrize("n_workers", [0, -1, 1.5, True])
def test_invalid_worker_counts_are_refused(n_workers):
    with pytest.raises(ValueError, match="n_workers"):
        check_executor(None, n_workers)


def test_a_client_and_a_worker_count_are_refused_together():
    with pytest.raises(ValueError, match="not both"):
        check_executor(object(), 2)


@pinnable
@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_workers_get_disjoint_nearly_equal_shares_of_the_cpus(monkeypatch, workers):
    monkeypatch.setattr(executors.os, "sched_getaffinity", lambda pid: set(range(8)))
    shares = cpu_shares(workers)
    assert len(shares) == workers
    assert set().union(*shares) == set(range(8))
    assert sum(map(len, shares)) == 8
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@pinnable
def test_more_workers_than_cpus_share_them_in_turn(monkeypatch):
    monkeypatch.setattr(executors.os, "sched_getaffinity", lambda pid: {4, 5})
    assert cpu_shares(5) == [{4}, {5}, {4}, {5}, {4}]


@pinnable
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to share out")
def test_each_worker_process_and_every_thread_in_it_run_on_its_own_cpus(monkeypatch):
    # Spawned workers cannot import this file again (importlib mode): the probe is a module beside
    # it, on a sys.path that the workers inherit.
    monkeypatch.syspath_prepend(Path(__file__).parent)
    probe = importlib.import_module("executor_workers").cpus_of_this_worker
    with multiprocessing.get_context("spawn").Manager() as manager:
        # Both chunks wait for each other, so each runs in its own worker.
        remote = functools.partial(probe, manager.Barrier(2))
        reports = map_chunks([0, 1], remote=remote, local=remote, n_workers=2, progressbar=False)
    shares = cpu_shares(2)
    assert len({pid for pid, _, _ in reports}) == 2
    pinned = sorted(([*threads[0]], blas) for _, threads, blas in reports)
    assert pinned == sorted(([*share], str(len(share))) for share in shares)
    for _, threads, _ in reports:
        assert all(cpus == threads[0] for cpus in threads)
