"""The first window of a remote epoch (issue 24, section 6): the fetch of every shard the reader's first
samples need is submitted before its first step, and the samples served are exactly those of a reader
that downloads nothing (the same dataset read from its own folder), in the same order."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import helpers
import numpy as np
from anchors import MDSWriter

from tessera.stream import StreamingDataLoader, StreamingDataset
from tessera.stream.batching.shard_needs import ShardNeed
from tessera.stream.prefetch import FIRST_FETCHES, Prefetcher

N = 300


def test_the_first_windows_fetches_are_submitted_before_the_first_step(tmp_path: Path) -> None:
    """The needs of the first window are taken, and their fetches submitted, by the constructor itself
    (not by the planning thread, later): the reader's first `wait_for` of each finds its fetch. The need
    beyond the window waits for the reader to move on."""
    first = 10
    taken: list[str] = []
    gate = threading.Event()

    def needs() -> Iterator[ShardNeed]:
        for shard in range(first):
            taken.append(threading.current_thread().name)
            yield ShardNeed(shard, sample_index=3 * shard, position=-1)
        taken.append(threading.current_thread().name)
        yield ShardNeed(first, sample_index=10_000, position=-1)

    def fetch(shard: int, rank: object) -> Path:
        gate.wait(30)
        return tmp_path / f"s{shard}"

    prefetcher = Prefetcher(needs(), fetch, lambda shard: tmp_path / f"s{shard}", window=512)
    try:
        here = threading.current_thread().name
        assert taken[:first] == [here] * first and all(prefetcher.pending(s) for s in range(first + 1))
        gate.set()
        assert [prefetcher.wait_for(shard) for shard in range(first)] == [tmp_path / f"s{s}" for s in range(first)]
        assert prefetcher.wait_for(first) is None  # not started: 10,000 samples ahead of the reader
    finally:
        prefetcher.close()
    assert FIRST_FETCHES >= first


def ids_of(loader) -> list[int]:
    out = []
    for batch in loader:
        ids = [int(i) for i in np.asarray(batch["id"]).reshape(-1)]
        for i, s in zip(ids, batch["s"], strict=True):
            assert s == helpers.expected_s(i)
        out += ids
    return out


def test_a_remote_compressed_epoch_serves_what_a_local_reader_serves(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with MDSWriter(out=str(data), columns={"id": "int", "s": "str"}, compression="zstd", size_limit=600) as writer:
        for i in range(N):
            writer.write({"id": i, "s": helpers.expected_s(i)})
    for workers in (0, 2):
        local = StreamingDataset(local=str(data), batch_size=8, shuffle=True, shuffle_seed=5)
        remote = StreamingDataset(remote=str(data), local=str(tmp_path / f"cache{workers}"), batch_size=8,
                                  shuffle=True, shuffle_seed=5)
        want = ids_of(StreamingDataLoader(local, batch_size=8, num_workers=workers))
        assert sorted(set(want)) == list(range(N))
        assert ids_of(StreamingDataLoader(remote, batch_size=8, num_workers=workers)) == want
