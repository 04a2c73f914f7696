"""`StreamingDataLoader(persistent_workers=True)`: workers outlive an epoch yet serve exactly the order
fresh workers would, every epoch, after a resume, and after an epoch broken off part-way."""

from __future__ import annotations

import multiprocessing
from itertools import islice
from pathlib import Path

import helpers
import pytest

from tessera.shards import ShardWriter
from tessera.stream import StreamingDataLoader, StreamingDataset
from tessera.stream.slots import FILLED

N, B, EPOCHS = 240, 4, 3
def forkserver() -> multiprocessing.context.BaseContext:
    """Forkserver workers, started from a server that has imported tessera.stream (and torch) once."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tessera.stream"])
    return ctx


# (name, dataset, loader options): the per-sample path ("mixed" has a str column: collated in the
# workers), batches gathered into shared slots by fork()ed workers ("fixed" has only fixed-size columns),
# the batch path, and BatchRefs from forkserver workers (no shared slots).
PATHS = [
    ("samples", "mixed", {}),
    ("slots", "fixed", {}),
    ("batch_path", "fixed", {"batch_path": True}),
    ("forkserver", "fixed", {"multiprocessing_context": forkserver()}),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("persistent")
    helpers.write_elastic(root / "mixed", range(N))
    with ShardWriter(root / "fixed", {"id": "int", "x": "ndarray:int64:4"}, size_limit=1400) as writer:
        for i in range(N):
            writer.write({"id": i, "x": helpers.expected_x(i)})
    return {"mixed": root / "mixed", "fixed": root / "fixed"}


def loader_for(data: Path, workers: int, persistent: bool, **options) -> StreamingDataLoader:
    ds = StreamingDataset(local=str(data), batch_size=B, shuffle=True, shuffle_seed=11)
    if not workers:
        options.pop("multiprocessing_context", None)
    return StreamingDataLoader(ds, num_workers=workers, persistent_workers=persistent, **options)


def ids(batches) -> list[list[int]]:
    return [[int(i) for i in batch["id"]] for batch in batches]


def epochs(loader: StreamingDataLoader, count: int = EPOCHS) -> list[list[list[int]]]:
    return [ids(loader) for _ in range(count)]


@pytest.fixture(scope="module")
def reference(data: dict[str, Path]) -> dict[str, list[list[list[int]]]]:
    """Three epochs of each dataset from a loader without workers: the order all others must give."""
    out = {kind: epochs(loader_for(path, 0, False)) for kind, path in data.items()}
    for got in out.values():
        assert all(sorted(i for b in e for i in b) == list(range(N)) for e in got)  # each sample once
        assert got[0] != got[1] != got[2]  # each epoch its own order
    return out


@pytest.mark.parametrize("name,kind,options", PATHS, ids=[p[0] for p in PATHS])
def test_persistent_workers_give_every_epoch_in_the_order_of_fresh_ones(data, reference, name, kind,
                                                                        options) -> None:
    loader = loader_for(data[kind], 2, True, **options)
    got, from_slots = [], 0
    for _ in range(EPOCHS):
        got.append([])
        for batch in loader:
            got[-1].append([int(i) for i in batch["id"]])
            from_slots = max(from_slots, loader._ring.handed_out if loader._ring else 0)
    workers = loader._iterator._workers
    assert got == reference[kind]
    if name != "forkserver":  # (fresh forkserver workers each epoch would cost seconds, and add nothing)
        assert epochs(loader_for(data[kind], 2, False, **options)) == reference[kind]
    assert loader._iterator._workers is workers and all(w.is_alive() for w in workers)  # the same processes
    assert (from_slots > 0) == (name in ("slots", "batch_path"))  # the shared-slot path really ran


@pytest.mark.parametrize("name,kind,options", PATHS[:3], ids=[p[0] for p in PATHS[:3]])
def test_persistent_workers_resume_mid_epoch_two(data, reference, name, kind, options) -> None:
    k, ref = 7, reference[kind]
    first = loader_for(data[kind], 2, True, **options)
    assert ids(first) == ref[0]
    assert ids(islice(first, k)) == ref[1][:k]
    state = first.state_dict()
    # a new loader, and the running one whose workers are still alive, both continue exactly there
    fresh = loader_for(data[kind], 2, True, **options)
    fresh.load_state_dict(state)
    assert epochs(fresh, 2) == [ref[1][k:], ref[2]]
    first.load_state_dict(state)
    assert epochs(first, 2) == [ref[1][k:], ref[2]]
    # and a state from before this loader's position takes it back
    first.load_state_dict(loader_for(data[kind], 0, False).state_dict())
    assert ids(first) == ref[0]


def test_epoch_broken_off_restarts_as_with_fresh_workers(data, reference) -> None:
    ref = reference["fixed"]
    for persistent in (False, True):
        loader = loader_for(data["fixed"], 2, persistent)
        assert ids(islice(loader, 5)) == ref[0][:5]
        assert epochs(loader, 2) == ref[:2]  # the broken-off epoch again, whole, then the next
        # slots the broken-off epoch filled (items the DataLoader dropped) are free again, not lost
        assert loader._ring is not None and not (loader._ring.state == FILLED).any()


def test_persistent_workers_need_workers(data) -> None:
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        loader_for(data["fixed"], 0, True)
