"""`sampling_granularity`: a stream's partial repeat is drawn from shards in granules (mixing.py).

Checks ported from MosaicML Streaming's tests/test_sampling.py (counts add up, stay within each shard,
are deterministic, and balanced over shards on average), plus what the granules mean: every shard but
at most one gives a whole number of granules, g = 1 is the plain uniform split, and a dataset with a
granularity serves exactly its counts.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.shards import ShardWriter
from tessera.stream import Stream, StreamingDataset
from tessera.stream.batching.epoch_plan import PlanConfig, RunPlan
from tessera.stream.batching.mixing import StreamShards, check_granularity, split_count, split_granules
from tessera.stream.shuffle import philox

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def is_whole_granules(count: int, size: int, g: int) -> bool:
    """`count` samples of a shard of `size` are whole granules: k full ones, with or without its short last."""
    tail = size % g
    return count % g == 0 or (tail > 0 and count >= tail and (count - tail) % g == 0)


@st.composite
def draws(draw: st.DrawFn) -> tuple[np.ndarray, int, int, int]:
    sizes = np.array(draw(st.lists(st.integers(0, 60), min_size=1, max_size=12)), dtype=np.int64)
    total = int(sizes.sum())
    count = draw(st.integers(0, total))
    return sizes, count, draw(st.integers(1, 70)), draw(st.integers(0, 2**32))


@FAST
@given(draws())
def test_granule_counts_add_up_within_each_shard_and_are_whole_granules_but_one(case) -> None:
    sizes, count, g, seed = case
    counts = split_granules(sizes, count, g, philox(seed, 1))
    assert int(counts.sum()) == count
    assert (counts >= 0).all() and (counts <= sizes).all()
    partial = [i for i in range(sizes.size) if not is_whole_granules(int(counts[i]), int(sizes[i]), g)]
    assert len(partial) <= 1, (sizes.tolist(), counts.tolist(), g)


@FAST
@given(draws())
def test_granule_counts_are_deterministic_and_granularity_1_is_the_uniform_split(case) -> None:
    sizes, count, g, seed = case
    first = split_granules(sizes, count, g, philox(seed, 1))
    assert first.tolist() == split_granules(sizes, count, g, philox(seed, 1)).tolist()
    assert split_granules(sizes, count, 1, philox(seed, 1)).tolist() == split_count(sizes, count, philox(seed, 1)).tolist()


def test_a_granularity_of_a_whole_shard_picks_whole_shards_and_one_part() -> None:
    sizes = np.full(40, 25, dtype=np.int64)
    counts = split_granules(sizes, 310, 25, philox(7, 1))
    assert sorted(counts.tolist(), reverse=True)[:13] == [25] * 12 + [10]
    assert np.count_nonzero(counts) == 13


def test_granules_are_balanced_over_shards_on_average() -> None:
    """Mosaic's balance check: over many draws every shard is sampled at about the same rate."""
    rng = np.random.default_rng(5)
    sizes = 1_000 + rng.integers(0, 1_000, 10)
    count = int(sizes.sum()) // 3
    total = np.zeros(sizes.size)
    for seed in range(300):
        total += split_granules(sizes, count, int(1 + seed % 99), philox(seed, 2))
    rates = total / 300 / sizes
    assert rates.std() / rates.mean() < 0.05


def test_a_large_stream_with_fine_granules_splits_in_o_shards_steps() -> None:
    sizes = np.full(20_000, 50_000, dtype=np.int64)  # 10^9 samples, 2*10^8 granules of 5
    counts = split_granules(sizes, 123_456_789, 5, philox(3, 1))
    assert int(counts.sum()) == 123_456_789 and (counts <= sizes).all()


@pytest.mark.parametrize("bad", [0, -3, 1.5, "4", True])
def test_granularity_must_be_a_positive_integer(bad) -> None:
    with pytest.raises(ValueError, match="sampling_granularity must be an integer >= 1"):
        check_granularity(bad)


def test_granularity_changes_the_plan_fingerprint_only_when_not_1() -> None:
    def fingerprint(g: int) -> str:
        return RunPlan([StreamShards([10, 20], repeat=0.5, granularity=g)], PlanConfig()).fingerprint
    before = RunPlan([StreamShards([10, 20], repeat=0.5)], PlanConfig()).fingerprint
    assert fingerprint(1) == before != fingerprint(4) != fingerprint(5)


def test_a_dataset_with_a_granularity_serves_whole_granules_of_its_shards(tmp_path, monkeypatch) -> None:
    """choose=70 of 160 samples in granules of 8: each shard gives whole granules but one, each sample
    at most once, and the next epoch another draw (balanced sampling)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with ShardWriter(tmp_path / "d", {"id": "int"}, size_limit=400) as w:
        for i in range(160):
            w.write({"id": i})
    ds = StreamingDataset(streams=[Stream(local=str(tmp_path / "d"), choose=70)], sampling_granularity=8,
                          shuffle=True, batch_size=10, num_canonical_nodes=1)
    sizes = ds.samples_per_shard.tolist()
    assert ds.num_shards >= 5 and any(n % 8 for n in sizes), sizes  # short last granules occur
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        ids = [int(s["id"]) for s in ds]
        assert len(ids) == len(set(ids)) == 70
        shard_of = np.searchsorted(ds.sample_offset_per_shard, ids, side="right") - 1
        counts = np.bincount(shard_of, minlength=ds.num_shards).tolist()
        partial = [i for i, (c, n) in enumerate(zip(counts, sizes, strict=True)) if not is_whole_granules(c, n, 8)]
        assert len(partial) <= 1, (counts, sizes)
        epochs.append(sorted(ids))
    assert epochs[0] != epochs[1]
