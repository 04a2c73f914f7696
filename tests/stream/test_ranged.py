"""Ranged reads (src/tessera/stream/ranged.py) against the real SeaweedFS server.

While a shard's whole download is in flight, the samples a batch needs from it are fetched by ranged
GETs. To prove a batch was served before its shards were in the cache without relying on timing, the
tests hold every whole-shard download at a gate (the cache's fetch waits) until they release it.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import numpy as np
import pytest

from tessera.shards import ShardWriter
from tessera.shards.errors import CorruptShard
from tessera.storage import open_store
from tessera.stream import StreamingDataLoader, StreamingDataset, ranged

N, BLOB = 240, 4000  # ~24 samples per shard of 100 kB: 10 shards


@pytest.fixture(autouse=True)
def single_process_world(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ranged, "MIN_MISSING_BYTES", 0)  # these shards are tiny (1 MB in all)


def hold_downloads(ds: StreamingDataset) -> threading.Event:
    """Whole-shard fetches wait until the returned event is set, the iteration's prefetcher is closed (an
    error ended the epoch: its close waits for the held fetches) or 60 s have passed."""
    gate = threading.Event()

    def closing() -> bool:
        active = ds._shards.active
        return active is not None and active._stopped

    for st in ds.streams:
        fetch = st.cache.fetch

        def held(entry: Any, rank_of: Any = None, optional: bool = False, fetch=fetch, cache=st.cache) -> Any:
            deadline = time.monotonic() + 60
            while not cache.is_ready(entry) and not gate.wait(0.05) and not closing():
                if time.monotonic() > deadline:
                    break
            return fetch(entry, rank_of, optional)

        st.cache.fetch = held  # type: ignore[method-assign]
    return gate


def make(remote: str, cache: Path, **kwargs: Any) -> StreamingDataset:
    return StreamingDataset(remote=remote, local=str(cache), shuffle=True, batch_size=8, num_canonical_nodes=8,
                            **kwargs)


def cached_shards(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob("shard.*.mds"))


def check_epoch(batches: list[dict[str, Any]]) -> None:
    ids = np.concatenate([np.asarray(b["id"]) for b in batches]).tolist()
    assert sorted(ids) == list(range(N))  # exactly once (N divides by the batch: no padding)
    for b in batches:
        for i, blob in zip(np.asarray(b["id"]).tolist(), np.asarray(b["blob"]), strict=True):
            assert np.array_equal(blob, helpers.expected_blob(i, BLOB)), i


def write(remote: str, variable: bool = False, **kwargs: Any) -> None:
    """Fixed-size columns only, so DataLoader workers hand batches over as (shard, row) references, and
    a shard's offsets follow from index.json (its header is fetched together with the first rows). With
    `variable`, a str column too: the header must be read before any row."""
    columns = {"id": "int", "blob": f"ndarray:uint8:{BLOB}", **({"s": "str"} if variable else {})}
    with ShardWriter(remote, columns, size_limit=100_000, **kwargs) as w:
        for i in range(N):
            w.write({"id": i, "blob": helpers.expected_blob(i, BLOB), **({"s": "x" * (i % 7)} if variable else {})})


@pytest.fixture
def blobs(s3_bucket: str) -> str:
    remote = f"{s3_bucket}/blobs"
    write(remote)
    return remote


@pytest.fixture
def blobs_variable(s3_bucket: str) -> str:
    remote = f"{s3_bucket}/blobs-variable"
    write(remote, variable=True)
    return remote


def offsets_known(ds: StreamingDataset) -> bool:
    return ds._shards.ranged._computed_offsets(0) is not None


@pytest.mark.parametrize("layout", ["blobs", "blobs_variable"])
def test_first_batches_come_by_ranged_reads_before_their_shards_are_cached(layout: str, tmp_path: Path,
                                                                           request: pytest.FixtureRequest) -> None:
    blobs = request.getfixturevalue(layout)
    cache = tmp_path / "cache"
    reference = list(make(blobs, tmp_path / "ref", ranged_reads=False).iter_batches())
    ds = make(blobs, cache)
    assert offsets_known(ds) == (layout == "blobs")  # header with the first rows / header first
    gate = hold_downloads(ds)
    try:
        it = ds.iter_batches()
        first = [next(it) for _ in range(3)]
        assert cached_shards(cache) == []  # every whole-shard download is still held
        assert ds._shards.ranged.served >= 3 * 8
        shards_of_first = set(ds._locate(np.asarray(first[0]["id"]))[0].tolist())
        assert len(shards_of_first) > 1
    finally:
        gate.set()
    batches = first + list(it)
    assert len(cached_shards(cache)) == 10  # the downloads went on, and later batches read the cache
    check_epoch(batches)
    for got, want in zip(batches, reference, strict=True):  # the same bytes, in the same order
        assert np.array_equal(got["id"], want["id"]) and np.array_equal(got["blob"], want["blob"])
    assert ds._shards.ranged.sparse == {} and ds._shards.ranged.held == 0


def test_per_sample_path_and_worker_handoff_carry_ranged_batches(blobs: str, tmp_path: Path) -> None:
    ds = make(blobs, tmp_path / "cache")
    gate = hold_downloads(ds)
    try:
        it = ds.iter_batch_groups(4, refs=True)  # what a DataLoader worker sends
        group = next(it)
        assert len(group.batches()) == 1  # a worker's first item is one batch (schedule.group_sizes)
        assert group.data is not None and sorted(group.data) == [0]  # gathered in the "worker"
    finally:
        gate.set()
    items = [group, *it]
    batches = [b for refs in items for b in ds.gather_refs(refs)]  # what the training process yields
    ds._close_readers()
    check_epoch(batches)
    assert items[-1].data is None  # once the shards are cached, references only

    ds = make(blobs, tmp_path / "cache2")
    gate = hold_downloads(ds)
    try:
        it2: Iterator[dict[str, Any]] = iter(ds)
        samples = [next(it2) for _ in range(8)]
        assert cached_shards(tmp_path / "cache2") == [] and ds._shards.ranged.served >= 8
    finally:
        gate.set()
    samples += list(it2)
    check_epoch([{"id": np.array([s["id"] for s in samples]), "blob": np.stack([s["blob"] for s in samples])}])


def test_dataloader_workers_serve_the_same_epoch(blobs: str, tmp_path: Path) -> None:
    """Workers (forked from a clean process or a forkserver) serve ranged batches as data, the rest as
    references; either way the epoch is exactly the reference one."""
    reference = list(make(blobs, tmp_path / "ref", ranged_reads=False).iter_batches())
    for batch_path in (True, False):
        ds = make(blobs, tmp_path / f"cache{batch_path}")
        loader = StreamingDataLoader(ds, batch_size=8, num_workers=2, batch_path=batch_path)
        assert loader._refs
        batches = [{k: v.numpy() for k, v in b.items()} for b in loader]
        check_epoch(batches)
        for got, want in zip(batches, reference, strict=True):
            assert np.array_equal(got["id"], want["id"]) and np.array_equal(got["blob"], want["blob"])


@pytest.mark.parametrize("case", ["compressed", "validate_hash", "off"])
def test_ranged_reads_off_where_they_cannot_apply(case: str, s3_bucket: str, tmp_path: Path) -> None:
    remote = f"{s3_bucket}/ds"
    extra = {"compression": "zstd"} if case == "compressed" else {"hashes": ["xxh64"]}
    write(remote, **extra)
    kwargs = {"validate_hash": "xxh64"} if case == "validate_hash" else {}
    if case == "off":
        kwargs["ranged_reads"] = False
    ds = make(remote, tmp_path / "cache", **kwargs)
    assert not any(ds._shards.ranged.eligible(s) for s in range(len(ds._entries)))
    gate = hold_downloads(ds)
    threading.Timer(0.5, gate.set).start()  # the first batch can only come after the downloads
    batches = list(ds.iter_batches())
    assert gate.is_set() and ds._shards.ranged.served == 0
    check_epoch(batches)


def test_no_ranged_reads_when_the_missing_shards_are_small(blobs: str, tmp_path: Path, monkeypatch) -> None:
    """Below MIN_MISSING_BYTES of missing shards, the first batch waits for them as before."""
    monkeypatch.setattr(ranged, "MIN_MISSING_BYTES", 10 << 20)
    ds = make(blobs, tmp_path / "cache")
    batches = list(ds.iter_batches())
    assert ds._shards.ranged.served == 0
    check_epoch(batches)


@pytest.mark.parametrize("layout", ["blobs", "blobs_variable"])
def test_corrupt_offset_table_is_a_clear_error(layout: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    blobs = request.getfixturevalue(layout)
    store = open_store(blobs)
    name = "shard.00003.mds"
    data = bytearray(store.get(name))
    n = struct.unpack_from("<I", data, 0)[0]
    struct.pack_into("<I", data, 4 + 4 * n, len(data) + 8)  # the last offset now runs past the end
    store.put(name, bytes(data))  # same size: index.json still matches it
    ds = make(blobs, tmp_path / "cache", shuffle_seed=1)
    gate = hold_downloads(ds)
    try:
        with pytest.raises(CorruptShard, match=name) as err:
            for _ in ds.iter_batches():
                pass
        assert "index.json" in str(err.value)
    finally:
        gate.set()
    assert os.path.exists(tmp_path / "cache")
