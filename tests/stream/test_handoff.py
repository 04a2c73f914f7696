"""How batches get from DataLoader workers to the training process, and how workers start.

- `WorkerBatches`: workers serve batches in groups; read round-robin, as torch's DataLoader reads its
  workers, the groups give every batch exactly once and in order (hypothesis).
- `gather`: a batch gathered from several shards equals the samples read one by one.
- `forksafe`: deciding to fork and a first object-store request are serialised (fork_gate); a remote
  dataset leaves obstore's runtime unstarted in the training process, so workers
  fork (no forkserver start-up); once something has started it, workers come from a forkserver and
  still read correctly (a real S3 server and a fresh interpreter).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import helpers
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.shards.reader import ShardReader
from tessera.storage import NotFound
from tessera.storage import fork_gate as fork_gate_module
from tessera.stream import (
    StreamingDataLoader,
    StreamingDataset,
    forksafe,
)
from tessera.stream.batching.device_layout import DeviceLayout, WorkerBatches, group_sizes
from tessera.stream.forksafe import call_outside_runtime
from tessera.stream.gather import BatchRefs, OutputPool, all_fixed_size, gather

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- worker groups -------------------------------------------------------------------------------------

@FAST
@given(st.integers(0, 40), st.integers(0, 150), st.integers(0, 5), st.integers(1, 7))
def test_worker_groups_read_round_robin_give_every_batch_once_in_order(first: int, n: int, workers: int,
                                                                        group: int) -> None:
    total = first + n
    readers = max(1, workers)
    lists = [WorkerBatches(first, total, DeviceLayout(num_workers=workers, worker_id=w, group=group))
             for w in range(readers)]
    # Sequence behaviour: len, slices, single items and iteration agree.
    for seq in lists:
        as_list = list(seq)
        assert len(as_list) == len(seq)
        assert seq[0:len(seq)].tolist() == as_list
        if as_list:
            assert seq[len(seq) - 1] == as_list[-1] and seq[-1] == as_list[-1]
    # A DataLoader takes one item (a group) from each worker in turn, skipping exhausted ones.
    # Groups are 1, 2, 4, ... batches while below `group`, then `group` (group_sizes).
    items = [[c for g in itertools.islice(group_sizes(group), len(seq) + 1)
              if (c := list(itertools.islice(it, g)))] for seq in lists for it in [iter(list(seq))]]
    served, turn = [], [0] * readers
    while any(turn[w] < len(items[w]) for w in range(readers)):
        for w in range(readers):
            if turn[w] < len(items[w]):
                served += items[w][turn[w]]
                turn[w] += 1
    assert served == list(range(first, total))


# --- gathering -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("columns", [None, ["id", "x"]])
def test_gather_over_several_shards_equals_reading_samples_one_by_one(tmp_path: Path, columns) -> None:
    helpers.write_elastic(tmp_path / "ds", range(200), size_limit=900)
    ds = StreamingDataset(local=str(tmp_path / "ds"), batch_size=8, columns=columns)
    assert all_fixed_size(ds.streams[0].entries, columns) is (columns is not None)
    readers: dict[int, ShardReader] = {}

    def reader(shard: int) -> ShardReader:
        return readers.setdefault(shard, ds._reader(shard))

    def check(batch_ids: np.ndarray) -> dict:
        shards, rows = ds._locate(batch_ids)
        batch = gather(reader, shards, rows)
        for j, (shard, row) in enumerate(zip(shards.tolist(), rows.tolist(), strict=True)):
            one = reader(shard).get(row)
            assert set(batch) == set(one)
            for name, value in one.items():
                assert np.array_equal(np.asarray(batch[name][j]), np.asarray(value)), name
        return batch

    rng = np.random.default_rng(3)
    ids = rng.permutation(200)
    for lo in range(0, 200, 40):  # ~5 rows per shard: copied row by row
        assert len(set(ds._locate(ids[lo:lo + 40])[0].tolist())) > 1
        check(ids[lo:lo + 40])
    first = int(ds._shard_base[1])
    few = ids[ids < 2 * first + 5]  # two or three shards, many rows each: a gather + scatter per shard
    assert 1 < len(set(ds._locate(few)[0].tolist())) <= 3
    held = check(few)
    kept = {name: np.array(v, copy=True) for name, v in held.items()}
    check(few[::-1])  # a second batch while the first is held: pooled outputs are not reused under it
    assert all(np.array_equal(held[name], kept[name]) for name in kept)
    check(ids[ids < first])  # one shard: one copy
    refs = BatchRefs.of([ds._locate(ids[:5]), ds._locate(ids[5:12])])
    assert [len(s) for s, _ in refs.batches()] == [5, 7]
    assert np.array_equal(np.concatenate([r for _, r in refs.batches()]), ds._locate(ids[:12])[1])


def test_output_pool_reuses_an_array_only_once_nothing_else_holds_it() -> None:
    pool = OutputPool(max_bytes=3 * 64 * 8)
    a = pool.empty((8, 8), np.dtype(np.int64))
    a_id = id(a)
    b = pool.empty((8, 8), np.dtype(np.int64))
    assert b is not a  # `a` is held
    view = a[2:4]
    del a
    c = pool.empty((8, 8), np.dtype(np.int64))
    assert id(c) != a_id and c is not b  # a view of `a` still holds it
    del view, c
    assert id(pool.empty((8, 8), np.dtype(np.int64))) == a_id  # released: reused
    held = [pool.empty((8, 8), np.dtype(np.int64)) for _ in range(4)]
    assert len({id(x) for x in held}) == 4 and pool.pooled <= pool.max_bytes  # past the bound: plain arrays


# --- fork safety ---------------------------------------------------------------------------------------

def test_call_outside_runtime_forks_returns_results_and_raises_errors_with_their_attributes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fork_gate_module, "_used", False)  # as in a process that made no request yet
    monkeypatch.setattr(forksafe, "runtime_started", lambda: False)
    assert call_outside_runtime(lambda: (os.getpid(), b"x" * 100_000))[0] != os.getpid()
    assert len(call_outside_runtime(lambda: b"x" * 5_000_000)) == 5_000_000  # larger than a pipe buffer

    def missing() -> None:
        raise NotFound("s3://b/k: no such key", "s3://b/k")

    with pytest.raises(NotFound) as info:
        call_outside_runtime(missing)
    assert info.value.url == "s3://b/k"
    fork_gate_module.note_request()  # once a request has been made here, fork()ed children would hang
    assert call_outside_runtime(os.getpid) == os.getpid()


def test_a_first_request_waits_while_a_fork_is_decided(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fork_gate_module, "_used", False)
    about_to_request, done = threading.Event(), threading.Event()

    def first_request() -> None:
        about_to_request.set()
        fork_gate_module.note_request()
        done.set()

    with fork_gate_module.fork_gate() as gate_open:
        assert gate_open and not fork_gate_module.requests_made()
        thread = threading.Thread(target=first_request)
        thread.start()
        about_to_request.wait()
        assert not done.wait(0.2)  # blocked until the fork (here: this block) is over
    thread.join()
    assert done.is_set() and fork_gate_module.requests_made()
    with fork_gate_module.fork_gate() as gate_open:
        assert not gate_open


FORK_SCRIPT = r"""
import json, sys
from tessera.storage import open_store
from tessera.stream import StreamingDataLoader, StreamingDataset
from tessera.stream.forksafe import runtime_started

remote, cache = sys.argv[1], sys.argv[2]
ds = StreamingDataset(remote=remote, local=cache, shuffle=True, batch_size=4)
out = {"runtime_after_dataset": runtime_started()}
loader = StreamingDataLoader(ds, batch_size=4, num_workers=2)
out["fork_epoch"] = [[int(i) for i in b["id"]] for b in loader]
out["fork_context"] = loader.multiprocessing_context is None  # None: the platform default, fork
out["runtime_after_epoch"] = runtime_started()
open_store(remote).get("index.json")  # obstore's runtime now runs in this process
out["runtime_after_get"] = runtime_started()
out["forkserver_epoch"] = [[int(i) for i in b["id"]] for b in loader]  # the loader's second epoch
out["forkserver_context"] = loader.multiprocessing_context.get_start_method()
print(json.dumps(out))
"""


def test_remote_workers_fork_unless_obstore_already_runs(s3_bucket: str, tmp_path: Path) -> None:
    remote = f"{s3_bucket}/forks"
    helpers.write_elastic(remote, range(120))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", FORK_SCRIPT, remote, str(tmp_path / "cache")], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["runtime_after_dataset"] is False and out["runtime_after_epoch"] is False
    assert out["fork_context"] is True
    assert out["runtime_after_get"] is True and out["forkserver_context"] == "forkserver"
    # Both epochs read exactly what a single process reads (ids are checked by their payload elsewhere).
    expect = StreamingDataLoader(StreamingDataset(remote=remote, local=str(tmp_path / "ref"), shuffle=True,
                                                  batch_size=4), batch_size=4)
    for epoch in ("fork_epoch", "forkserver_epoch"):
        assert out[epoch] == [[int(i) for i in b["id"]] for b in expect], epoch


class _Tagged(StreamingDataset):
    """A subclass that transforms what it reads: the loader must not bypass it with BatchRefs."""

    def __iter__(self):
        for sample in super().__iter__():
            yield {**sample, "tag": np.int64(1)}

    def iter_batches(self):
        for batch in super().iter_batches():
            yield {**batch, "tag": np.ones(len(batch["id"]), dtype=np.int64)}


@pytest.mark.parametrize("batch_path", [False, True])
def test_workers_keep_a_subclass_transform(tmp_path: Path, batch_path: bool) -> None:
    helpers.write_elastic(tmp_path / "ds", range(96))
    plain = StreamingDataLoader(StreamingDataset(local=str(tmp_path / "ds"), batch_size=8, columns=["id", "x"]),
                                num_workers=2, batch_path=batch_path)
    tagged = StreamingDataLoader(_Tagged(local=str(tmp_path / "ds"), batch_size=8, columns=["id", "x"]),
                                 num_workers=2, batch_path=batch_path)
    assert plain._refs and not tagged._refs
    got = list(tagged)
    assert [b["id"].tolist() for b in got] == [b["id"].tolist() for b in plain]
    assert all(b["tag"].tolist() == [1] * 8 for b in got)


def test_columns_chosen_from_the_loaded_indexes_are_the_ones_read(tmp_path: Path) -> None:
    """A function given as `columns` sees the loaded streams (their index.json read once) and picks what
    the readers decode: the same batches as naming those columns outright."""
    helpers.write_elastic(tmp_path / "ds", range(48))
    seen: list[list[str]] = []

    def pick(streams) -> list[str]:
        seen.append(sorted(streams[0].entries[0].column_names))
        return ["id"]

    chosen = StreamingDataset(local=str(tmp_path / "ds"), batch_size=8, columns=pick)
    named = StreamingDataset(local=str(tmp_path / "ds"), batch_size=8, columns=["id"])
    assert seen == [sorted(named.streams[0].entries[0].column_names)] and "x" in seen[0]
    assert chosen.columns == ["id"]
    got, want = list(chosen.iter_batches()), list(named.iter_batches())
    assert [set(b) for b in got] == [{"id"}] * len(want)
    assert [b["id"].tolist() for b in got] == [b["id"].tolist() for b in want]
