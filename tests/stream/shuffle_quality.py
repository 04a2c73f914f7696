"""Shuffle-quality metrics for tests: how well an epoch order mixes shards, measured on a materialised
order, so that Tessera's plan can be compared with MosaicML's py1e (tests/stream/test_plan.py). They are
diagnostics of the plan's design, not something a training run computes, which is why they live here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.stream.batching.epoch_plan import EpochPlan


@dataclass(frozen=True)
class ShuffleQuality:
    """How well an epoch order mixes shards (computed on a materialised order: a diagnostic only).

    - `shard_spread`: mean over shards of the std of their samples' positions, over the epoch length
      (higher is better; a uniform random permutation gives about 0.289).
    - `shard_span`: mean over shards of (last - first position) over the epoch length.
    - `lane_same_shard`: fraction of lane neighbours (positions g and g + L) from the same shard (lower is
      better; a uniform permutation gives about sum of squared shard shares).
    - `lane_lag1_correlation`: Pearson correlation of the shard ids at g and g + L.
    - `same_shard`: fraction of neighbours g, g + 1 from the same shard.
    """

    shard_spread: float
    shard_span: float
    lane_same_shard: float
    lane_lag1_correlation: float
    same_shard: float


def sequence_quality(sample_ids: np.ndarray, shard_sizes: np.ndarray, num_lanes: int) -> ShuffleQuality:
    """`ShuffleQuality` of an order given as global sample ids over shards of `shard_sizes`."""
    ids = np.asarray(sample_ids, dtype=np.int64)
    shard = np.searchsorted(np.cumsum(np.asarray(shard_sizes, dtype=np.int64)), ids, side="right")
    n = ids.size
    pos = np.arange(n, dtype=np.float64)
    count = np.bincount(shard)
    used = count >= 2
    mean = np.bincount(shard, pos)[used] / count[used]
    var = np.bincount(shard, pos * pos)[used] / count[used] - mean * mean
    order = np.argsort(shard, kind="stable")
    edges = np.flatnonzero(np.diff(shard[order])) + 1
    first = np.minimum.reduceat(order, np.concatenate([[0], edges]))
    last = np.maximum.reduceat(order, np.concatenate([[0], edges]))
    span = (last - first)[count[count > 0] >= 2]
    a, b = shard[:-num_lanes], shard[num_lanes:]
    corr = float(np.corrcoef(a, b)[0, 1]) if a.size > 1 and a.std() > 0 and b.std() > 0 else 0.0
    return ShuffleQuality(
        shard_spread=float(np.sqrt(np.maximum(var, 0)).mean() / n),
        shard_span=float(span.mean() / n),
        lane_same_shard=float((a == b).mean()),
        lane_lag1_correlation=corr,
        same_shard=float((shard[:-1] == shard[1:]).mean()),
    )


def shuffle_quality(plan: EpochPlan) -> ShuffleQuality:
    """`ShuffleQuality` of an `EpochPlan`'s sequence S (materialises S: for test-sized plans)."""
    ids = plan.samples_at(np.arange(len(plan), dtype=np.int64))
    return sequence_quality(ids, plan.run.units.shard_sizes, plan.num_lanes)
