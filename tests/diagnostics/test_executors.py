"""Chunked replicates: split in order, run in this process with a bar, executor choice checked."""

from __future__ import annotations

import os

import jax
import pytest

from dpppl.diagnostics import executors
from dpppl.diagnostics.executors import check_executor, default_workers, map_chunks, split


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
