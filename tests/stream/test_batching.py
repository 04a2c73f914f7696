"""batching_method="stratified" and "per_stream" (tessera.stream.batching.stream_batches): plan-level properties, plus
real StreamingDataset / StreamingDataLoader iterations in this process (0 and 2 DataLoader workers)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import helpers
import numpy as np
import pytest

from tessera.stream import PlanStateMismatch, Stream, StreamingDataLoader, StreamingDataset
from tessera.stream.batching.device_layout import DeviceLayout
from tessera.stream.batching.epoch_plan import PlanConfig, RunPlan
from tessera.stream.batching.methods import stream_schedule
from tessera.stream.batching.mixing import StreamShards
from tessera.stream.batching.stream_batches import StreamPlans, stratified_counts

G = 12
LAYOUTS = [(1, None), (2, None), (2, 1), (4, 2), (4, 1)]  # (world size, ranks per node)


def run_plans(shuffle: bool = True, seed: int = 3) -> StreamPlans:
    return helpers.three_stream_plans(shuffle, seed)


def stream_of(plans: StreamPlans, ids: np.ndarray) -> np.ndarray:
    return np.searchsorted(plans.sample_base, ids, side="right") - 1


def union(sched, t: int, world: int, per_node: int | None) -> list[int]:
    return sorted(i for r in range(world) for i in sched.samples_for(t, r, world, per_node).tolist())


def worker_union(sched, world: int, per_node: int | None, workers: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in range(world):
        for w in range(max(1, workers)):
            for t, ids in sched.worker_batches(DeviceLayout(world, r, per_node, workers, w)):
                assert len(ids) == G // world
                out.setdefault(t, []).extend(ids.tolist())
    return {t: sorted(v) for t, v in out.items()}


# --- stratified ----------------------------------------------------------------------------------------

def test_stratified_counts_are_largest_remainder_as_mosaicml() -> None:
    assert stratified_counts([333, 333, 334], 10).tolist() == [3, 3, 4]
    assert stratified_counts([5, 5, 5, 5], 4).tolist() == [1, 1, 1, 1]
    assert stratified_counts([150, 90, 60], 12).tolist() == [6, 4, 2]
    assert stratified_counts([100, 100], 7).tolist() == [3, 4]  # a tie goes to the higher stream, as MosaicML's
    with pytest.raises(ValueError, match="Number of samples for stream 0 is 0 .* size 4"):
        stratified_counts([1, 1000], 4)  # a stream in no batch: refused, as MosaicML (not given one each batch)
    with pytest.raises(ValueError, match="Number of samples for stream 0 is 0"):
        stratified_counts([5, 5, 5], 2)


@pytest.mark.parametrize("shuffle", [True, False])
def test_stratified_batches_hold_fixed_counts_and_cover_each_stream(shuffle: bool) -> None:
    plans = run_plans(shuffle)
    for epoch in (0, 1):
        sched = stream_schedule(plans, "stratified", epoch, G)
        g = sched.counts
        assert g.sum() == G and (g >= 1).all()
        assert sched.total_batches == min(n // c for n, c in zip(sched.lengths, g, strict=True))  # as MosaicML
        served = [Counter() for _ in plans.streams]
        for t in range(sched.num_batches):
            ids = sched.global_batch(t)
            s = stream_of(plans, ids)
            assert np.bincount(s, minlength=len(g)).tolist() == g.tolist()  # g_s of stream s, every batch
            assert (np.diff(s) >= 0).all()  # concatenated in stream order
            for si, i in zip(s.tolist(), ids.tolist(), strict=True):
                served[si][i] += 1
        for si, plan in enumerate(sched.epoch_plans):
            n, nb = len(plan), sched.total_batches * g[si]
            seq = plan.samples_at(np.arange(n)) + plans.sample_base[si]
            # S_s[0 : batches*g_s], leaving a tail (dropped), as documented: only whole batch parts.
            assert nb <= n and served[si] == Counter(seq[:nb].tolist())
            assert sched.padding[si] == 0 and sched.dropped[si] == n - nb
        # Stream 0 is taken whole: S_0 holds each of its samples once (plus < lanes lane padding).
        s0 = sched.epoch_plans[0].samples_at(np.arange(len(sched.epoch_plans[0])))
        assert set(s0.tolist()) == set(range(105)) and len(s0) - 105 < 4


def test_stratified_global_batches_are_the_same_set_for_every_layout() -> None:
    sched = stream_schedule(run_plans(), "stratified", 0, G)
    ref = [union(sched, t, 1, None) for t in range(sched.num_batches)]
    for world, per_node in LAYOUTS[1:]:
        assert [union(sched, t, world, per_node) for t in range(sched.num_batches)] == ref
        for workers in (0, 2, 3):
            got = worker_union(sched, world, per_node, workers)
            assert [got[t] for t in range(sched.num_batches)] == ref


# --- per_stream --------------------------------------------------------------------------------------

def test_per_stream_batches_come_from_one_stream_in_proportion() -> None:
    plans = run_plans()
    sched = stream_schedule(plans, "per_stream", 0, G)
    assert sched.stream_batches == [int(n) // G for n in sched.lengths]  # whole batches only, as MosaicML
    order = []
    for t in range(sched.num_batches):
        s = set(stream_of(plans, sched.global_batch(t)).tolist())
        assert len(s) == 1  # one stream per global batch
        order.append(s.pop())
    assert order == [sched.stream_of(t) for t in range(sched.num_batches)]
    assert Counter(order) == dict(enumerate(sched.stream_batches))
    # Spread evenly: after any prefix of t batches, stream s has had t * B_s / total of them, +-1.
    share = np.array(sched.stream_batches) / sched.total_batches
    seen = np.zeros(len(share))
    for t, s in enumerate(order):
        seen[s] += 1
        assert (np.abs(seen - (t + 1) * share) <= 1.5).all()
    # Batch k of stream s is S_s[k*G : (k+1)*G]: each stream's weighted samples at most once, its tail left out.
    for si, plan in enumerate(sched.epoch_plans):
        got = Counter(i for t in range(sched.num_batches) if order[t] == si for i in sched.global_batch(t).tolist())
        n = len(plan)
        seq = plan.samples_at(np.arange(n)) + plans.sample_base[si]
        assert got == Counter(seq[np.arange(sched.stream_batches[si] * G) % n].tolist())


def test_per_stream_same_set_for_every_layout_and_jumps_without_walking() -> None:
    sched = stream_schedule(run_plans(), "per_stream", 1, G)
    ref = [union(sched, t, 1, None) for t in range(sched.num_batches)]
    walk = list(sched.merged(0))
    assert walk == [sched.locate(t) for t in range(sched.total_batches)]
    for t0 in (1, 7, sched.total_batches - 1):
        assert list(sched.merged(t0)) == walk[t0:]
    for world, per_node in LAYOUTS[1:]:
        assert [union(sched, t, world, per_node) for t in range(sched.num_batches)] == ref
        got = worker_union(sched, world, per_node, 2)
        assert [got[t] for t in range(sched.num_batches)] == ref


def test_per_stream_locate_is_fast_deep_in_a_long_epoch() -> None:
    streams = [StreamShards(np.full(100, 10_000), proportion=p) for p in (0.5, 0.3, 0.15, 0.05)]
    plans = StreamPlans(RunPlan(streams, PlanConfig(seed=1, num_lanes=8, shuffle=True, epoch_size=10**9)))
    sched = stream_schedule(plans, "per_stream", 0, 8)
    t = sched.total_batches - 12_345
    s, k = sched.locate(t)
    assert sum(sched._before(s, k)) == t
    later = list(zip(range(5), sched.merged(t), strict=False))
    assert [p for _, p in later] == [sched.locate(t + i) for i in range(5)]


# --- through StreamingDataset, in this process ---------------------------------------------------------

B_BASE = helpers.B_BASE


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.write_two_streams(tmp_path_factory.mktemp("batching"))


def make(data: Path, method: str, batch_size: int) -> StreamingDataset:
    streams = [Stream(remote=str(data / "A"), local=str(data / "cache" / "A"), proportion=0.7),
               Stream(remote=str(data / "B"), local=str(data / "cache" / "B"), proportion=0.3)]
    return StreamingDataset(streams=streams, epoch_size=300, shuffle=True, shuffle_block_size=32,
                            num_canonical_nodes=4, batch_size=batch_size, batching_method=method)


def to_ids(index: np.ndarray) -> list[int]:
    return sorted(helpers.two_stream_ids(index))


def plan_batches(ds: StreamingDataset, start: int = 0) -> list[list[int]]:
    sched = ds._batching.schedule(ds._run, ds._epoch, G, start)
    return [to_ids(sched.global_batch(t)) for t in range(sched.num_batches)]


def set_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))


@pytest.mark.parametrize("method", ["stratified", "per_stream"])
@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_serves_the_planned_global_batches(data: Path, method: str, workers: int) -> None:
    ds = make(data, method, G)
    ref = plan_batches(ds)
    loader = StreamingDataLoader(ds, batch_size=G, num_workers=workers)
    got = [sorted(b["id"].tolist()) for b in loader]
    assert got == ref
    assert len(ds) == len(ref) * G
    if method == "stratified":
        g = ds._batching.schedule(ds._run, 0, G).counts.tolist()
        assert all([sum(i < B_BASE for i in b), sum(i >= B_BASE for i in b)] == g for b in got)
    else:
        assert all(len({i >= B_BASE for i in b}) == 1 for b in got)


@pytest.mark.parametrize("method", ["stratified", "per_stream"])
def test_resume_mid_epoch_on_another_world_size(data: Path, method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = make(data, method, G)
    ref = plan_batches(ds)
    loader = StreamingDataLoader(ds, batch_size=G)
    it = iter(loader)
    first = [sorted(next(it)["id"].tolist()) for _ in range(5)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert first == ref[:5] and state["samples_consumed"] == 5 * G and state["batching_method"] == method
    ranks = []
    for rank in range(2):
        set_rank(monkeypatch, rank, 2)
        other = make(data, method, G // 2)
        resumed = StreamingDataLoader(other, batch_size=G // 2)
        resumed.load_state_dict(state)
        ranks.append([b["id"].tolist() for b in resumed])
    assert [sorted(a + b) for a, b in zip(*ranks, strict=True)] == ref[5:]  # nothing skipped or repeated


def test_state_of_another_batching_method_or_batch_size_is_refused(data: Path) -> None:
    state = make(data, "random", G).state_dict(0)
    with pytest.raises(PlanStateMismatch, match="batching_method"):
        make(data, "stratified", G).load_state_dict(state)
    strat = make(data, "stratified", G).state_dict(2 * G)
    with pytest.raises(PlanStateMismatch, match="batching_method"):
        make(data, "random", G).load_state_dict(strat)
    with pytest.raises(PlanStateMismatch, match="global_batch_size"):
        make(data, "stratified", G // 2).load_state_dict(strat)
    with pytest.raises(ValueError, match="global batch boundaries"):
        make(data, "per_stream", G).state_dict(G + 1)
    with pytest.raises(PlanStateMismatch, match="batching_method"):
        make(data, "device_per_stream", G).load_state_dict(strat)
    with pytest.raises(ValueError, match="unknown batching_method"):
        make(data, "roundrobin", G)
    with pytest.raises(ValueError, match="Number of samples for stream 1 is 0"):
        make(data, "stratified", 1)
