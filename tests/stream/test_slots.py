"""Shared batch slots (slots.py) and the one-call gather (gather.py).

- `gather` copies each column of a batch with one index_select over a span of all its shards' rows
  (RowAddresses, which follows readers closed and reopened at other addresses):
  the result equals reading the samples one by one, for any rows of any shards (hypothesis), into
  pooled arrays or given ones, for strided multi-column layouts; mixed layouts are refused.
- `SlotRing`: a slot is reused only once nothing refers to the batch handed out from it (tensor, torch
  view, numpy view); a worker with no free slot gets -1 (the batch then goes as plain BatchRefs).
- Through real fork()ed DataLoader workers: batches come from slots, equal those of the main process in
  order, and a consumer that keeps every batch (so slots run out) still sees each one unchanged.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.shards.reader import ShardReader
from tessera.shards.writer import ShardWriter
from tessera.stream import StreamingDataLoader, StreamingDataset, slots
from tessera.stream.gather import gather
from tessera.stream.row_addresses import RowAddresses
from tessera.stream.slots import FILLED, FREE, OUT, SlotRing

FIXED = {"id": "int", "x": "ndarray:int16:5", "w": "float32", "tokens": "ndarray:uint16:3,4"}


def sample(i: int) -> dict:
    return {"id": i, "x": np.arange(5, dtype=np.int16) * i, "w": np.float32(i / 7),
            "tokens": (np.arange(12, dtype=np.uint16) + i).reshape(3, 4)}


def write_fixed(out: Path, n: int, size_limit: int = 1200, columns: dict | None = None) -> None:
    """All columns fixed-size (strided column views, ~20 samples per shard)."""
    with ShardWriter(out, columns or FIXED, size_limit=size_limit) as writer:
        for i in range(n):
            writer.write(sample(i))


@pytest.fixture(scope="module")
def fixed_ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fixed") / "ds"
    write_fixed(out, 400)
    return out


def _readers(ds: StreamingDataset):
    cache: dict[int, ShardReader] = {}
    return lambda shard: cache.setdefault(shard, ds._reader(shard))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 399), min_size=1, max_size=70), st.booleans())
def test_gather_equals_samples_read_one_by_one(fixed_ds: Path, ids: list[int], into: bool) -> None:
    ds = StreamingDataset(local=str(fixed_ds), batch_size=1)
    reader = _readers(ds)
    shards, rows = ds._locate(np.array(ids))
    given_out = {"id": np.empty(len(ids), np.int64), "x": np.empty((len(ids), 5), np.int16),
                 "w": np.empty(len(ids), np.float32), "tokens": np.empty((len(ids), 3, 4), np.uint16)}
    batch = gather(reader, shards, rows, out=given_out if into else None)
    if into:
        assert batch is given_out
    for j, i in enumerate(ids):
        want = sample(i)
        for name, value in want.items():
            assert np.array_equal(batch[name][j], value), (name, i)


def test_row_addresses_follow_readers_that_are_closed_and_reopened(tmp_path: Path) -> None:
    """One RowAddresses over a dataset of 100+ shards (its arrays grow), readers closed and reopened at
    other addresses between batches: every batch still equals the samples read one by one."""
    write_fixed(tmp_path / "many", 500, size_limit=240)
    ds = StreamingDataset(local=str(tmp_path / "many"), batch_size=1)
    assert len(ds._entries) > 100
    book, open_now = RowAddresses(), {}

    def reader(shard: int) -> ShardReader:
        if shard not in open_now:
            open_now[shard] = ShardReader(ds._shards.path(shard), ds.streams[0].entries[shard])
        return open_now[shard]

    rng = np.random.default_rng(7)
    for round_ in range(6):
        ids = rng.choice(500, size=64, replace=True)
        shards, rows = ds._locate(ids)
        batch = gather(reader, shards, rows, addresses=book)
        for j, i in enumerate(ids.tolist()):
            assert np.array_equal(batch["tokens"][j], sample(i)["tokens"]) and batch["id"][j] == i
        for shard in list(open_now)[round_ % 2::2]:  # close half of them: reopened at new addresses
            open_now.pop(shard).close()


def test_gather_refuses_a_batch_of_shards_whose_columns_do_not_stack(tmp_path: Path) -> None:
    write_fixed(tmp_path / "a", 30)
    write_fixed(tmp_path / "b", 30, columns={**FIXED, "x": "ndarray:int16:5"})
    with ShardWriter(tmp_path / "c", {**FIXED, "x": "ndarray:int16:6"}) as writer:
        for i in range(30):
            writer.write({**sample(i), "x": np.arange(6, dtype=np.int16)})
    a = ShardReader(next((tmp_path / "a").glob("shard.00000.mds")))
    c = ShardReader(next((tmp_path / "c").glob("shard.00000.mds")))
    by_shard = {0: a, 1: c}
    with pytest.raises(ValueError, match="do not stack"):
        gather(by_shard.__getitem__, np.array([0, 1]), np.array([0, 0]))


def _fill(ring: SlotRing, worker: int = 0) -> int:
    layout = (("v", "<i8", (4,)),)
    return ring.fill(worker, layout, 8, lambda out: out["v"].__setitem__(slice(None), 7))


def test_a_slot_is_reused_only_once_nothing_refers_to_its_batch() -> None:
    ring = SlotRing(workers=2, per_worker=2, nbytes=8 * 4 * 8)
    layout = (("v", "<i8", (4,)),)
    a, b = _fill(ring), _fill(ring)
    assert (a, b) == (0, 1) and _fill(ring) == -1  # worker 0's two slots are taken: no wait, no overwrite
    assert _fill(ring, worker=1) == 2  # worker 1 has slots of its own
    assert ring.state.tolist() == [FILLED, FILLED, FILLED, FREE]
    batch_a = ring.hand_out(a, layout, 8)
    tensor = torch.from_numpy(batch_a["v"])[2:]  # a torch view of the handed-out array
    view = batch_a["v"][::2]  # and a numpy view
    del batch_a
    ring.hand_out(b, layout, 8)  # dropped at once
    ring.reclaim()
    assert ring.state[:2].tolist() == [OUT, FREE]
    assert int(tensor.sum()) == 7 * 24
    del tensor
    ring.reclaim()
    assert ring.state[0] == OUT  # the numpy view still holds it
    del view
    ring.reclaim()
    assert ring.state[:2].tolist() == [FREE, FREE]
    ring.reset()  # a new iteration: slot 2 was filled by a worker of the last one, never handed out
    assert ring.state.tolist() == [FREE] * 4


def test_a_batch_that_does_not_fit_its_slot_is_not_placed() -> None:
    ring = SlotRing(workers=1, per_worker=2, nbytes=64)
    assert ring.fill(0, (("v", "<i8", (4,)),), 8, lambda out: None) == -1
    assert SlotRing.sized_for(2, 1 << 30) is None  # too large for the ring's budget: plain BatchRefs


def test_loader_pickles_without_its_ring(fixed_ds: Path) -> None:
    loader = StreamingDataLoader(StreamingDataset(local=str(fixed_ds), batch_size=8), num_workers=2,
                                 batch_path=True)
    loader.dataset.ring = SlotRing(2, 2, 64)
    assert pickle.loads(pickle.dumps(loader.dataset)).ring is None  # spawned workers send plain refs


def _in_ring(ring: SlotRing | None, tensor: torch.Tensor) -> bool:
    if ring is None:
        return False
    start = np.frombuffer(ring._mm, np.uint8).__array_interface__["data"][0]
    return start <= tensor.data_ptr() < start + len(ring._mm)


def _main_process_batches(path: Path, epoch: int = 0) -> list[dict[str, np.ndarray]]:
    ds = StreamingDataset(local=str(path), batch_size=8, shuffle=True, shuffle_seed=5)
    ds.set_epoch(epoch)
    return [{k: np.array(v) for k, v in b.items()} for b in ds.iter_batches()]


def _same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w)
        for name in w:
            assert np.array_equal(np.asarray(g[name]), w[name]), name


@pytest.mark.parametrize("batch_path", [True, False])
def test_workers_gather_into_slots_and_batches_equal_the_main_process(fixed_ds: Path, batch_path: bool) -> None:
    ds = StreamingDataset(local=str(fixed_ds), batch_size=8, shuffle=True, shuffle_seed=5)
    loader = StreamingDataLoader(ds, num_workers=2, batch_path=batch_path)
    for epoch in range(2):  # the ring is made once and reused by the next epoch's workers
        from_slots, got = 0, []
        for batch in loader:
            from_slots += all(_in_ring(loader._ring, v) for v in batch.values())
            got.append({k: v.numpy().copy() for k, v in batch.items()})
        assert from_slots == len(got)  # every batch is a view of the shared mapping: no copy here
        _same(got, _main_process_batches(fixed_ds, epoch))


def test_an_iteration_broken_off_leaves_the_ring_to_the_next_one(fixed_ds: Path) -> None:
    ds = StreamingDataset(local=str(fixed_ds), batch_size=8, shuffle=True, shuffle_seed=5)
    loader = StreamingDataLoader(ds, num_workers=2, batch_path=True)
    it = iter(loader)
    early = [next(it) for _ in range(3)]  # held while the next iteration runs
    it.close()  # broken off mid-epoch: its workers stop, the same epoch starts again below
    again = [{k: v.numpy().copy() for k, v in b.items()} for b in loader]
    assert all(_in_ring(loader._ring, b["id"]) for b in early)
    _same(again, _main_process_batches(fixed_ds))
    _same([{k: v.numpy() for k, v in b.items()} for b in early], _main_process_batches(fixed_ds)[:3])


def test_a_consumer_keeping_every_batch_never_sees_one_overwritten(fixed_ds: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots, "SLOTS_PER_WORKER", 3)  # 50 batches, 6 slots: most go as plain refs
    monkeypatch.setattr(slots, "MIN_SLOTS_PER_WORKER", 3)
    ds = StreamingDataset(local=str(fixed_ds), batch_size=8, shuffle=True, shuffle_seed=5)
    loader = StreamingDataLoader(ds, num_workers=2, batch_path=True)
    kept = list(loader)  # every batch held until the end
    assert loader._ring is not None and loader._ring.per_worker == 3
    assert sum(_in_ring(loader._ring, b["id"]) for b in kept) == 6
    assert int((loader._ring.state == OUT).sum()) == 6  # all slots handed out and still held
    _same([{k: v.numpy() for k, v in b.items()} for b in kept], _main_process_batches(fixed_ds))
