"""StreamingDataset over packed indexes (issue 24): the same order as before for the same seed, a small
pickled dataset, and DataLoader workers of every start method reading exactly the planned samples."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from linked_index import expected_row, write_linked
from order_cases import GOLDEN, orders, write_data

from tessera.stream import StreamingDataLoader, StreamingDataset


@pytest.fixture(scope="module")
def linked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("linked")
    return root, write_linked(root, 300, samples=16)


def test_orders_equal_the_ones_recorded_before_packing(tmp_path: Path) -> None:
    assert orders(write_data(tmp_path)) == json.loads(GOLDEN.read_text())


def _planned(ds: StreamingDataset, real: int) -> np.ndarray:
    """The tokens of every sample of the epoch, in the plan's order, from the content rule alone."""
    rows = [expected_row(s, r, real) for shards, local, _ in ds._epoch_batches()
            for s, r in zip(shards.tolist(), local.tolist(), strict=True)]
    ds.set_epoch(0)
    return np.stack(rows)


def test_the_pickled_dataset_stays_small_whatever_the_shard_count(tmp_path: Path, linked) -> None:
    root, _ = linked
    many = tmp_path / "many"
    many.mkdir()
    write_linked(many, 3000, samples=16)
    small = len(pickle.dumps(StreamingDataset(local=str(root), batch_size=8, shuffle=True)))
    large = len(pickle.dumps(StreamingDataset(local=str(many), batch_size=8, shuffle=True)))
    assert small < 16_000 and abs(large - small) < 200  # the packed index goes as its location


def _mark_a_built_plan(sample: dict) -> dict:
    """A transform run in DataLoader workers: leaves a mark when the worker's run plan made the unit
    permutation, which only a process building an epoch's lanes (rather than mapping them) does."""
    info = torch.utils.data.get_worker_info()
    if info is not None and "_unit_order" in info.dataset.dataset._run.__dict__:  # (the loader's view of it)
        Path(os.environ["PLAN_BUILT_MARK"]).touch()
    return sample


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_workers_of_every_start_method_read_the_planned_samples(linked, context: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root, real = linked
    ds = StreamingDataset(local=str(root), batch_size=8, shuffle=True, shuffle_seed=3, transform=_mark_a_built_plan)
    want = _planned(ds, real)
    mark = tmp_path / "built"
    monkeypatch.setenv("PLAN_BUILT_MARK", str(mark))
    workers = 2 if context == "fork" else 1  # (a spawned worker imports torch afresh: seconds each)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, multiprocessing_context=context,
                                 batch_path=True)
    got = np.concatenate([batch["tokens"].numpy() for batch in loader])
    assert got.shape == want.shape == (300 * 16, 16)
    assert np.array_equal(got, want)
    assert context == "fork" or not mark.exists()  # spawned workers map the plan files the dataset made


def test_a_second_dataset_maps_the_plan_the_first_built_and_a_damaged_file_is_rebuilt(
        linked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, real = linked
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # plan files of this test only
    first = StreamingDataset(local=str(root), batch_size=8, shuffle=True, shuffle_seed=5)
    want = _planned(first, real)
    folder = first._run.store.folder
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["e0.cuts", "e0.lane0"]
    second = StreamingDataset(local=str(root), batch_size=8, shuffle=True, shuffle_seed=5)
    assert np.array_equal(_planned(second, real), want)
    assert "_unit_order" not in second._run.__dict__  # mapped, not built
    lane = folder / "e0.lane0"
    data = bytearray(lane.read_bytes())
    data[-9] ^= 0x10  # a flipped bit in the pieces: the checksum no longer holds
    lane.write_bytes(bytes(data))
    third = StreamingDataset(local=str(root), batch_size=8, shuffle=True, shuffle_seed=5)
    assert np.array_equal(_planned(third, real), want)
    assert "_unit_order" in third._run.__dict__ and lane.read_bytes() != bytes(data)  # built and written again
    for epoch in (1, 2, 3):
        third.set_epoch(epoch)
        next(third._epoch_batches())
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        "e2.cuts", "e2.lane0", "e3.cuts", "e3.lane0"]  # this epoch's files and the previous one's


def test_a_rank_holds_only_the_lanes_its_node_reads(linked, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = linked
    for name, value in {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)  # rank 2: the first of node 1 of 2
    ds = StreamingDataset(local=str(root), batch_size=8, shuffle=True, num_canonical_nodes=4)
    batches = ds._epoch_batches()
    for _ in range(40):
        next(batches)
    plan = ds._run.epoch(0)
    assert sorted(plan._lanes) == [1, 3]  # 2 nodes of 4 lanes: node 1 reads lanes 1 and 3
    every = sum(plan.lane(lane)["units"].size for lane in range(4))
    assert sum(plan._lanes[lane]["units"].size for lane in (1, 3)) < 0.6 * every


def test_a_resume_from_workers_continues_exactly(linked) -> None:
    root, real = linked
    ds = StreamingDataset(local=str(root), batch_size=8, shuffle=True, shuffle_seed=4)
    want = _planned(ds, real)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=2)
    it = iter(loader)
    seen = [next(it)["tokens"].numpy() for _ in range(37)]
    state = loader.state_dict()
    del it
    resumed = StreamingDataset(local=str(root), batch_size=8, shuffle=True, shuffle_seed=4)
    again = StreamingDataLoader(resumed, batch_size=8)
    again.load_state_dict(state)
    rest = np.concatenate([batch["tokens"].numpy() for batch in again])
    assert np.array_equal(np.concatenate(seen + [rest]), want)
