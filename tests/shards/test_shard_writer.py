"""ShardWriter: shard cutting, modes, atomic commits under crashes, background uploads, remote stores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shard_helpers import read_json

from tessera.shards import (
    DatasetExists,
    EncodeError,
    MDSDataset,
    ShardWriter,
    UnknownEncoding,
    WriterError,
)
from tessera.shards.session import JOURNAL_BASENAME
from tessera.storage import open_store

COLUMNS = {"id": "int", "text": "str"}


def sample(i: int) -> dict:
    return {"id": i, "text": f"sample number {i}" + "!" * (i % 11)}


def write(out: str | Path, ids: range, **kwargs: object) -> ShardWriter:
    with ShardWriter(out, COLUMNS, **kwargs) as writer:
        for i in ids:
            writer.write(sample(i))
    return writer


def all_ids(out: str | Path, tmp: Path | None = None) -> list[int]:
    return [s["id"] for s in MDSDataset(out, cache_dir=tmp)]


def assert_index_names_only_present_shards(folder: Path) -> None:
    index = read_json(folder / "index.json")
    for entry in index["shards"]:
        stored = entry["zip_data"] or entry["raw_data"]
        assert (folder / stored["basename"]).stat().st_size == stored["bytes"]


# --- shard cutting -----------------------------------------------------------------------------------


def expected_counts(sizes: list[int], limit: int | None, config_size: int) -> list[int]:
    """MDS.md's rule, stated independently: cut when limit < current + len(sample) + 4, where current
    starts at 8 + len(config); an oversized first sample is preceded by an empty shard."""
    counts, current, count = [], 8 + config_size, 0
    for size in sizes:
        if limit is not None and limit < current + size + 4:
            counts.append(count)
            current, count = 8 + config_size, 0
        current += size + 4
        count += 1
    return counts + ([count] if count else [])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 600), max_size=60), st.one_of(st.none(), st.integers(1, 3000)))
def test_shard_cutting_follows_the_rule(lengths: list[int], limit: int | None) -> None:
    url = f"memory://cut-{uuid.uuid4().hex[:10]}"
    with ShardWriter(url, {"b": "bytes"}, size_limit=limit) as writer:
        for length in lengths:
            writer.write({"b": b"x" * length})
    config = len(json.dumps(writer._template.entry.config(), sort_keys=True))
    index = json.loads(open_store(url).get("index.json"))
    # a bytes sample is stored as a u32 size header plus its bytes
    assert [s["samples"] for s in index["shards"]] == expected_counts([n + 4 for n in lengths], limit, config)
    for entry in index["shards"]:
        assert limit is None or entry["raw_data"]["bytes"] <= limit or entry["samples"] <= 1


def test_invalid_settings(tmp_path: Path) -> None:
    with pytest.raises(UnknownEncoding, match="'x'.*'nope'"):
        ShardWriter(tmp_path / "a", {"x": "nope"})
    with pytest.raises(ValueError, match="invalid compression"):
        ShardWriter(tmp_path / "b", COLUMNS, compression="zstd:99")
    with pytest.raises(ValueError, match="4 GiB"):
        ShardWriter(tmp_path / "c", COLUMNS, size_limit="4gb")
    with pytest.raises(ValueError, match="unsupported hash"):
        ShardWriter(tmp_path / "d", COLUMNS, hashes=["crc99"])
    with pytest.raises(ValueError, match="mode must be"):
        ShardWriter(tmp_path / "e", COLUMNS, mode="replace")


def test_encode_errors_name_column_and_encoding(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, {"id": "int", "v": "ndarray:uint8:3"}) as writer:
        with pytest.raises(EncodeError, match="column 'id' \\(int\\)"):
            writer.write({"id": "seven", "v": np.zeros(3, np.uint8)})
        with pytest.raises(EncodeError, match="'v'.*expected shape"):
            writer.write({"id": 1, "v": np.zeros(4, np.uint8)})
        with pytest.raises(EncodeError, match="'v'.*missing"):
            writer.write({"id": 1})
        with pytest.raises(EncodeError, match="encoded to 2 bytes, expected 3"):
            writer.write({"id": 1, "v": b"ab"})
        writer.write({"id": 1, "v": b"abc"})
    assert MDSDataset(tmp_path)[0]["v"].tolist() == [97, 98, 99]


# --- modes ---------------------------------------------------------------------------------------------


def test_create_refuses_an_existing_dataset(tmp_path: Path) -> None:
    write(tmp_path, range(5))
    before = (tmp_path / "index.json").read_bytes()
    with pytest.raises(DatasetExists, match="mode='append'.*mode='resume'.*mode='overwrite'"):
        ShardWriter(tmp_path, COLUMNS)
    assert (tmp_path / "index.json").read_bytes() == before


def test_append_continues_numbering_and_keeps_shards(tmp_path: Path) -> None:
    write(tmp_path, range(40), size_limit=300)
    first = read_json(tmp_path / "index.json")["shards"]
    stamps = {e["raw_data"]["basename"]: (tmp_path / e["raw_data"]["basename"]).stat().st_mtime_ns for e in first}
    writer = write(tmp_path, range(40, 70), size_limit=300, mode="append")
    assert writer.committed_samples == 40
    shards = read_json(tmp_path / "index.json")["shards"]
    assert shards[: len(first)] == first
    assert shards[len(first)]["raw_data"]["basename"] == f"shard.{len(first):05}.mds"
    assert all((tmp_path / name).stat().st_mtime_ns == stamp for name, stamp in stamps.items())
    assert all_ids(tmp_path) == list(range(70))
    assert not (tmp_path / JOURNAL_BASENAME).exists()


def test_append_needs_the_same_columns(tmp_path: Path) -> None:
    write(tmp_path, range(3))
    with pytest.raises(ValueError, match="differ from the dataset"):
        ShardWriter(tmp_path, {"id": "int"}, mode="append")


def test_append_to_nothing_creates(tmp_path: Path) -> None:
    write(tmp_path / "new", range(4), mode="append")
    assert all_ids(tmp_path / "new") == [0, 1, 2, 3]


def test_overwrite_replaces_after_commit(tmp_path: Path) -> None:
    write(tmp_path, range(50), size_limit=300)
    old = {e["raw_data"]["basename"] for e in read_json(tmp_path / "index.json")["shards"]}
    write(tmp_path, range(100, 110), size_limit=300, mode="overwrite")
    assert all_ids(tmp_path) == list(range(100, 110))
    new = {e["raw_data"]["basename"] for e in read_json(tmp_path / "index.json")["shards"]}
    assert not old & new  # new files never reuse the names the old index used
    assert {p.name for p in tmp_path.glob("shard.*")} == new  # old shards deleted after the commit


def test_overwrite_interrupted_keeps_the_old_dataset(tmp_path: Path) -> None:
    write(tmp_path, range(30), size_limit=300)
    before = (tmp_path / "index.json").read_bytes()
    with pytest.raises(RuntimeError, match="boom"):
        with ShardWriter(tmp_path, COLUMNS, size_limit=300, mode="overwrite") as writer:
            for i in range(500, 540):
                writer.write(sample(i))
            raise RuntimeError("boom")
    assert (tmp_path / "index.json").read_bytes() == before
    assert all_ids(tmp_path) == list(range(30))
    with ShardWriter(tmp_path, COLUMNS, size_limit=300, mode="resume") as writer:
        start = 500 + writer.resumed_samples
        for i in range(start, 540):
            writer.write(sample(i))
    assert all_ids(tmp_path) == list(range(500, 540))
    assert len(list(tmp_path.glob("shard.*"))) == len(read_json(tmp_path / "index.json")["shards"])


# --- crashes ---------------------------------------------------------------------------------------------


def test_exception_in_block_commits_nothing_and_resume_continues(tmp_path: Path) -> None:
    write(tmp_path, range(20), size_limit=300)
    before = (tmp_path / "index.json").read_bytes()
    with pytest.raises(KeyError):
        with ShardWriter(tmp_path, COLUMNS, size_limit=300, mode="append") as writer:
            for i in range(20, 90):
                writer.write(sample(i))
            raise KeyError("producer failed")
    assert (tmp_path / "index.json").read_bytes() == before  # the previous commit, untouched
    assert_index_names_only_present_shards(tmp_path)
    with pytest.raises(DatasetExists):
        ShardWriter(tmp_path, COLUMNS)
    with ShardWriter(tmp_path, COLUMNS, size_limit=300, mode="resume") as writer:
        assert 0 < writer.resumed_samples < 70 and writer.committed_samples == 20 + writer.resumed_samples
        for i in range(20 + writer.resumed_samples, 90):
            writer.write(sample(i))
    assert all_ids(tmp_path) == list(range(90))
    assert not (tmp_path / JOURNAL_BASENAME).exists()


def test_resume_without_journal_is_an_append(tmp_path: Path) -> None:
    write(tmp_path, range(5))
    writer = write(tmp_path, range(5, 8), mode="resume")
    assert writer.resumed_samples == 0
    assert all_ids(tmp_path) == list(range(8))


class FailingPuts:
    """Wrap a store; fail puts of keys for which `fail(key)` is true. It poses as a remote store (no
    local paths), so every write goes through `put`."""

    def __init__(self, store, fail) -> None:
        self._store, self._fail = store, fail

    def local_path(self, key):
        return None

    def put(self, key, data):
        if self._fail(key):
            raise OSError(f"injected failure writing {key}")
        return self._store.put(key, data)

    def __getattr__(self, name):
        return getattr(self._store, name)


@pytest.mark.parametrize("crash_at", ["index.json", JOURNAL_BASENAME + ":delete"])
def test_crash_inside_the_commit_is_finished_by_resume(tmp_path: Path, crash_at: str) -> None:
    write(tmp_path, range(10), size_limit=300)
    store = open_store(tmp_path)
    if crash_at == "index.json":
        target = FailingPuts(store, lambda key: key == "index.json")
    else:

        def delete(key: str) -> None:
            if key == JOURNAL_BASENAME:
                raise OSError("injected failure deleting the journal")
            store.delete(key)

        target = FailingPuts(store, lambda key: False)
        target.delete = delete
    with pytest.raises(OSError, match="injected"):
        write(target, range(10, 30), size_limit=300, mode="append")
    assert_index_names_only_present_shards(tmp_path)
    assert all_ids(tmp_path) in (list(range(10)), list(range(30)))
    with ShardWriter(tmp_path, COLUMNS, size_limit=300, mode="resume") as writer:
        assert writer.resumed_samples == 20  # the interrupted writer had stored everything
    assert all_ids(tmp_path) == list(range(30))
    assert not (tmp_path / JOURNAL_BASENAME).exists()


def test_failed_upload_raises_and_commits_nothing(tmp_path: Path) -> None:
    store = FailingPuts(open_store(tmp_path), lambda key: key == "shard.00002.mds")
    with pytest.raises(WriterError, match="injected failure"):
        write(store, range(100), size_limit=300)
    assert not (tmp_path / "index.json").exists()


def test_shard_not_confirmed_is_never_committed(tmp_path: Path) -> None:
    store = open_store(tmp_path)

    class ShortHead(FailingPuts):
        def head(self, key):
            info = store.head(key)
            return type(info)(info.key, info.size - 1) if key == "shard.00001.mds" else info

    with pytest.raises(WriterError, match="expected"):
        write(ShortHead(store, lambda key: False), range(60), size_limit=300)
    assert not (tmp_path / "index.json").exists()


KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from tessera.shards import ShardWriter
    out, mode, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with ShardWriter(out, {"id": "int", "text": "str"}, size_limit=300, mode=mode) as writer:
        writer.journal_interval = 0.05  # journal often, so the test reaches its kill point quickly
        for i in range(start, start + 100000):
            writer.write({"id": i, "text": f"sample number {i}" + "!" * (i % 11)})
            time.sleep(0.0002)
    """
)


def _run_and_kill(out: Path, mode: str, start: int, wait_for_shards: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(out), mode, str(start)])
    journal = out / JOURNAL_BASENAME
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if journal.exists():
                try:
                    if len(read_json(journal)["shards"]) >= wait_for_shards:
                        break
                except (json.JSONDecodeError, FileNotFoundError):
                    pass
            time.sleep(0.01)
        else:
            pytest.fail("the writer subprocess made no progress")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_mid_write_keeps_the_previous_commit_then_resume(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    _run_and_kill(out, "create", 0, wait_for_shards=3)
    assert not (out / "index.json").exists()  # a create that never finished commits nothing
    with ShardWriter(out, COLUMNS, size_limit=300, mode="resume") as writer:
        first = writer.resumed_samples
        assert first > 0
        for i in range(first, first + 7):
            writer.write(sample(i))
    assert all_ids(out) == list(range(first + 7))
    before = (out / "index.json").read_bytes()
    _run_and_kill(out, "append", first + 7, wait_for_shards=len(read_json(out / "index.json")["shards"]) + 4)
    assert (out / "index.json").read_bytes() == before  # the killed append left the committed dataset as it was
    assert_index_names_only_present_shards(out)
    assert all_ids(out) == list(range(first + 7))
    with ShardWriter(out, COLUMNS, size_limit=300, mode="resume") as writer:
        total = first + 7 + writer.resumed_samples
        assert writer.resumed_samples > 0
    assert all_ids(out) == list(range(total))


# --- background pipeline ------------------------------------------------------------------------------


def test_memory_is_bounded_by_max_pending(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    in_flight, peak, lock = [0], [0], threading.Lock()

    class SlowPuts(FailingPuts):
        def put(self, key, data):
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            time.sleep(0.02)
            store.put(key, data)
            with lock:
                in_flight[0] -= 1

    started = time.monotonic()
    write(SlowPuts(store, lambda key: False), range(100), size_limit=300, max_pending=2)
    shards = len(read_json(tmp_path / "index.json")["shards"])
    assert peak[0] <= 3  # two shards plus the journal write racing the last one
    assert time.monotonic() - started >= 0.02 * shards / 2  # the producer waited for the slow store
    assert all_ids(tmp_path) == list(range(100))


# --- remote stores ---------------------------------------------------------------------------------------


def test_write_and_read_memory_store(tmp_path: Path) -> None:
    url = f"memory://w-{uuid.uuid4().hex[:8]}/prefix/ds"
    write(url, range(200), size_limit=1000, compression="zstd", hashes=["xxh64"])
    with pytest.raises(DatasetExists):
        ShardWriter(url, COLUMNS)
    write(url, range(200, 210), mode="append")
    keys = {info.key for info in open_store(url).list()}
    assert "index.json" in keys and JOURNAL_BASENAME not in keys
    assert all_ids(url, tmp_path / "cache") == list(range(210))


def test_write_and_read_s3(s3_bucket: str, tmp_path: Path) -> None:
    url = f"{s3_bucket}/datasets/tokens"
    columns = {"tokens": "ndarray:uint16:64", "id": "int"}
    with ShardWriter(url, columns, size_limit="4kb", compression="zstd:1", hashes=["sha1"]) as writer:
        for i in range(100):
            writer.write({"tokens": np.full(64, i, np.uint16), "id": i})
    ds = MDSDataset(url, cache_dir=tmp_path / "cache", verify_hashes=True)
    assert len(ds) == 100 and ds.num_shards > 1
    batch = ds.get_batch([99, 3])
    assert batch["tokens"].shape == (2, 64) and batch["tokens"][:, 0].tolist() == [99, 3]
    with ShardWriter(url, columns, mode="overwrite") as writer:
        writer.write({"tokens": np.zeros(64, np.uint16), "id": -1})
    assert [s["id"] for s in MDSDataset(url, cache_dir=tmp_path / "cache2")] == [-1]
    keys = sorted(info.key for info in open_store(url).list())
    assert keys == ["index.json", f"shard.{ds.num_shards:05}.mds"]  # old shards deleted, numbering continued
