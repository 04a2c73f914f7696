"""StreamingDataset over packed indexes (issue 24): the same order as before for the same seed, a small
pickled dataset, and DataLoader workers of every start method reading exactly the planned samples."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
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


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_workers_of_every_start_method_read_the_planned_samples(linked, context: str) -> None:
    root, real = linked
    ds = StreamingDataset(local=str(root), batch_size=8, shuffle=True, shuffle_seed=3)
    want = _planned(ds, real)
    workers = 2 if context == "fork" else 1  # (a spawned worker imports torch afresh: seconds each)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, multiprocessing_context=context,
                                 batch_path=True)
    got = np.concatenate([batch["tokens"].numpy() for batch in loader])
    assert got.shape == want.shape == (300 * 16, 16)
    assert np.array_equal(got, want)


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
