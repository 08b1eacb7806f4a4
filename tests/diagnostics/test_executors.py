"""Chunked replicates: split in order, run in this process with a bar, executor choice checked."""

from __future__ import annotations

import pytest

from dpppl.diagnostics.executors import check_executor, map_chunks, split


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


@pytest.mark.parametrize("n_workers", [0, -1, 1.5, True])
def test_invalid_worker_counts_are_refused(n_workers):
    with pytest.raises(ValueError, match="n_workers"):
        check_executor(None, n_workers)


def test_a_client_and_a_worker_count_are_refused_together():
    with pytest.raises(ValueError, match="not both"):
        check_executor(object(), 2)
