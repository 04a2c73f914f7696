"""batching_method="device_per_stream": every per-device batch holds one stream's samples.

Plan-level properties (single stream per device batch, every weighted sample once plus the documented
padding, determinism, a device-batch sequence independent of the world size, resume without walking) are
checked on `StreamPlans` in this process; the end-to-end behaviour (ranks as real processes, DataLoader
workers, resume on another world size, refused states) through `StreamingDataset`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import helpers
import numpy as np
import pytest

from tessera.stream import PlanStateMismatch, Stream, StreamingDataLoader, StreamingDataset
from tessera.stream.batching.device_layout import DeviceLayout
from tessera.stream.batching.device_per_stream import CHUNK, DevicePerStreamSchedule
from tessera.stream.batching.epoch_plan import PlanConfig, RunPlan
from tessera.stream.batching.methods import stream_schedule
from tessera.stream.batching.mixing import StreamShards
from tessera.stream.batching.stream_batches import StreamPlans

B = 4  # device batch size of the plan-level tests


def run_plans(shuffle: bool = True, seed: int = 3) -> StreamPlans:
    return helpers.three_stream_plans(shuffle, seed)


def schedule(plans: StreamPlans, world: int, start: int = 0, epoch: int = 0) -> DevicePerStreamSchedule:
    sched = stream_schedule(plans, "device_per_stream", epoch, B * world, start, B)
    assert isinstance(sched, DevicePerStreamSchedule)
    return sched


def device_sequence(sched: DevicePerStreamSchedule, world: int) -> list[list[int]]:
    """Device batches in sequence order: rank r of global batch t is entry t*world + r."""
    return [sched.samples_for(t, r, world).tolist() for t in range(sched.num_batches) for r in range(world)]


def stream_of(plans: StreamPlans, ids: list[int]) -> set[int]:
    return set((np.searchsorted(plans.sample_base, ids, side="right") - 1).tolist())


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world", [1, 3, 4])
def test_each_device_batch_is_one_stream_and_every_sample_is_served_once(shuffle: bool, world: int) -> None:
    plans = run_plans(shuffle)
    sched = schedule(plans, world)
    N = sched.num_device_batches
    assert sched.stream_batches == [-(-int(n) // B) for n in sched.lengths]
    assert sched.num_batches == -(-N // world)
    seq = device_sequence(sched, world)
    assert len(seq) == sched.num_batches * world and all(len(d) == B for d in seq)
    assert all(len(stream_of(plans, d)) == 1 for d in seq)  # one stream per device batch
    # The first N device batches: stream s's are S_s[k*B : (k+1)*B] for k = 0 .. D_s - 1, in order, so each
    # position of S_s (the weighted stream) is served exactly once, plus < B wrapped positions per stream.
    served = Counter(i for d in seq[:N] for i in d)
    expected: Counter = Counter()
    for si, plan in enumerate(sched.epoch_plans):
        n = len(plan)
        ids = plan.samples_at(np.arange(n)) + plans.sample_base[si]
        expected.update(ids[np.arange(sched.stream_batches[si] * B) % n].tolist())
        assert sched.stream_batches[si] * B - n < B
    assert served == expected
    for si in range(len(sched.stream_batches)):  # each stream read front to back
        ks = [int(k) for s, k in zip(*sched.device_batches(np.arange(N)), strict=True) if s == si]
        assert ks == list(range(sched.stream_batches[si]))
    assert len(seq) - N < world  # filler only completes the last global batch
    # Different devices of a global batch take different streams (in some global batch at least).
    if world > 1:
        assert any(len(stream_of(plans, [i for r in range(world) for i in seq[t * world + r]])) > 1
                   for t in range(sched.num_batches))


def test_sequence_is_deterministic_and_independent_of_the_world_size() -> None:
    ref = device_sequence(schedule(run_plans(), 1), 1)
    assert device_sequence(schedule(run_plans(), 1), 1) == ref  # fresh plans, same seed: same order
    for world in (2, 3, 4):
        assert device_sequence(schedule(run_plans(), world), world)[:len(ref)] == ref
    assert device_sequence(schedule(run_plans(seed=4), 1), 1) != ref
    assert device_sequence(schedule(run_plans(), 1, epoch=1), 1) != ref  # shuffled: each epoch differs
    # Without shuffle the streams' turns are the same every epoch (the partial streams' subsets still vary).
    plain = [schedule(run_plans(shuffle=False), 1, epoch=e) for e in (0, 1)]
    turns = [sched.device_batches(np.arange(sched.num_device_batches))[0].tolist() for sched in plain]
    assert turns[0] == turns[1]


def test_workers_and_ranks_split_the_sequence() -> None:
    plans = run_plans()
    for world in (1, 2, 3):
        sched = schedule(plans, world)
        for workers in (0, 2, 3):
            got: dict[tuple[int, int], list[int]] = {}
            for r in range(world):
                for w in range(max(1, workers)):
                    for t, ids in sched.worker_batches(DeviceLayout(world, r, None, workers, w)):
                        got[(t, r)] = ids.tolist()
            assert len(got) == sched.num_batches * world
            assert all(got[(t, r)] == sched.samples_for(t, r, world).tolist() for t, r in got)
        with pytest.raises(ValueError, match="ranks"):
            sched.check_layout(DeviceLayout(world + 1, 0))


@pytest.mark.parametrize("start_batches", [0, 1, 7, 30])
def test_resume_at_any_device_batch_on_any_world_size_continues_the_sequence(start_batches: int) -> None:
    plans = run_plans()
    ref = device_sequence(schedule(plans, 1), 1)
    for world in (1, 2, 3):
        resumed = schedule(plans, world, start=start_batches * B)
        assert resumed.num_batches == -(-(len(ref) - start_batches) // world)
        assert device_sequence(resumed, world)[:len(ref) - start_batches] == ref[start_batches:]
    with pytest.raises(ValueError, match="multiple of the device batch size"):
        schedule(plans, 2, start=B + 1)


def test_streams_are_spread_over_the_epoch_and_not_pinned_to_ranks() -> None:
    streams = [StreamShards([4000] * 10), StreamShards([4000] * 5)]
    plans = StreamPlans(RunPlan(streams, PlanConfig(seed=1, num_lanes=8, shuffle=True)))
    sched = stream_schedule(plans, "device_per_stream", 0, 2 * 16, 0, 16)
    assert isinstance(sched, DevicePerStreamSchedule)
    N = sched.num_device_batches
    stream, _ = sched.device_batches(np.arange(N))
    share = sched.stream_batches[0] / N
    for c in range(0, N, CHUNK):  # every chunk holds the streams in proportion (even merge), +-1
        assert abs(np.count_nonzero(stream[c:c + CHUNK] == 0) - share * stream[c:c + CHUNK].size) <= 1
    for rank in (0, 1):  # both ranks get both streams, in roughly the streams' proportion
        mine = stream[rank::2]
        assert 0.55 < np.count_nonzero(mine == 0) / mine.size < 0.78
    deep = stream_schedule(plans, "device_per_stream", 0, 2 * 16, (N - 3) * 16, 16)  # no walk to get there
    assert deep.num_batches == 2
    assert deep.samples_for(0, 1, 2).tolist() == sched.samples_for((N - 3 + 1) // 2, 0, 2).tolist()


def test_stream_too_small_for_a_device_batch_is_an_error() -> None:
    plans = StreamPlans(RunPlan([StreamShards([40, 40]), StreamShards([3])], PlanConfig(num_lanes=1)))
    with pytest.raises(ValueError, match="fewer than one device batch"):
        stream_schedule(plans, "device_per_stream", 0, 8, 0, 4)
    with pytest.raises(ValueError, match="device batch size"):
        stream_schedule(plans, "device_per_stream", 0, 8, 0)


# --- through StreamingDataset ----------------------------------------------------------------------------

B_BASE = helpers.B_BASE
DB = 6  # per-device batch size


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.write_two_streams(tmp_path_factory.mktemp("dps"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = helpers.ReaderServer(tmp_path_factory.mktemp("dps-server"))
    yield srv
    srv.close()


def dataset_kwargs(data: Path, batch_size: int = DB, proportion_b: float = 0.3) -> dict:
    streams = [dict(remote=str(data / "A"), local=str(data / "cache" / "A"), proportion=1 - proportion_b),
               dict(remote=str(data / "B"), local=str(data / "cache" / "B"), proportion=proportion_b)]
    return dict(streams=streams, epoch_size=300, shuffle=True, shuffle_block_size=32, num_canonical_nodes=4,
                batch_size=batch_size, batching_method="device_per_stream")


def make(data: Path, **kwargs: object) -> StreamingDataset:
    kw = dataset_kwargs(data, **kwargs)  # type: ignore[arg-type]
    return StreamingDataset(**{**kw, "streams": [Stream(**s) for s in kw["streams"]]})


def to_ids(index: np.ndarray) -> list[int]:
    return helpers.two_stream_ids(index)


def planned_sequence(data: Path, world: int, start: int = 0) -> list[list[int]]:
    ds = make(data)
    sched = ds._batching.schedule(ds._run, 0, DB * world, start)
    return [to_ids(sched.samples_for(t, r, world)) for t in range(sched.num_batches) for r in range(world)]


def interleave(rank_batches: list[list[list[int]]]) -> list[list[int]]:
    """Device batches of all ranks in sequence order (rank r of global batch t at t*world + r)."""
    assert len({len(b) for b in rank_batches}) == 1, "ranks served different numbers of batches"
    return [rb[t] for t in range(len(rank_batches[0])) for rb in rank_batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_as_processes_serve_single_stream_device_batches_and_resume_on_another_world(
        data: Path, server: helpers.ReaderServer, tmp_path: Path, workers: int) -> None:
    ref = planned_sequence(data, 1)
    kw = dataset_kwargs(data)
    full = helpers.wait_all(helpers.run_layout(tmp_path, "full", 2, 2, [
        {"dataset": kw, "num_workers": workers, "batch_path": workers > 0, "check": "elastic"}], server))
    assert all(r[0]["bad"] == 0 for r in full)
    seq = interleave([r[0]["epochs"][0] for r in full])
    assert all(len({i >= B_BASE for i in d}) == 1 for d in seq)  # each device batch: one stream
    assert seq[:len(ref)] == ref and len(seq) - len(ref) < 2  # the world-independent sequence, in order
    # Stop after 5 global batches on 2 ranks, resume on 3 ranks: the sequence continues exactly.
    state_path = tmp_path / "state-{rank}.json"
    first = helpers.wait_all(helpers.run_layout(tmp_path, "stop", 2, 2, [
        {"dataset": kw, "num_workers": workers, "stop_after": 5, "save_state": str(state_path)}], server))
    state = json.loads((tmp_path / "state-0.json").read_text())
    assert state["samples_consumed"] == 5 * 2 * DB and state["device_batch_size"] == DB
    resumed = helpers.wait_all(helpers.run_layout(tmp_path, "resume", 3, 3, [
        {"dataset": kw, "num_workers": workers, "load_state": str(tmp_path / "state-0.json"),
         "check": "elastic"}], server))
    assert all(r[0]["bad"] == 0 for r in resumed)
    head = interleave([r[0]["epochs"][0] for r in first])
    tail = interleave([r[0]["epochs"][0] for r in resumed])
    assert head == ref[:10]
    assert tail[:len(ref) - 10] == ref[10:] and len(tail) - (len(ref) - 10) < 3


def test_dataset_in_process_matches_the_plan_and_its_length(data: Path) -> None:
    ds = make(data)
    got = [to_ids_list(b["id"]) for b in StreamingDataLoader(ds, batch_size=DB)]
    ref = planned_sequence(data, 1)
    assert got == ref and len(ds) == len(ref) * DB
    state = StreamingDataLoader(ds, batch_size=DB).state_dict()
    assert state["batching_method"] == "device_per_stream" and state["device_batch_size"] == DB


def to_ids_list(ids: object) -> list[int]:
    return [int(i) for i in ids]  # type: ignore[attr-defined]


def test_bad_settings_and_foreign_states_are_refused(data: Path) -> None:
    with pytest.raises(ValueError, match="fewer than one device batch"):
        make(data, batch_size=40, proportion_b=0.1)  # stream B gives 30 samples an epoch
    state = make(data).state_dict(2 * DB)
    with pytest.raises(PlanStateMismatch, match="device_batch_size"):
        make(data, batch_size=DB // 2).load_state_dict(state)
    with pytest.raises(PlanStateMismatch, match="batching_method"):
        StreamingDataset(**{**dataset_kwargs(data), "batching_method": "per_stream",
                            "streams": [Stream(**s) for s in dataset_kwargs(data)["streams"]]}).load_state_dict(state)
    with pytest.raises(ValueError, match="multiple of"):
        make(data).state_dict(DB + 1)
