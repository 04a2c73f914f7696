"""`batching_method="random"`: global batch t is S[start + t*G : start + (t+1)*G] of the mixed sequence S.

S is the epoch plan's (`epoch_plan.EpochPlan`); this module cuts it into global batches, hands each
rank its positions (`device_layout.rank_positions`) and each DataLoader worker its batches. Resuming is a new
schedule whose `start` is the number of samples already consumed: O(1), whatever the position.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tessera.stream.batching.device_layout import CHUNK_SAMPLES, DeviceLayout, WorkerBatches, rank_positions
from tessera.stream.batching.epoch_plan import EpochPlan
from tessera.stream.batching.shard_needs import ShardNeed, first_needs


class BatchSchedule:
    """Global batches of S from position `start` on: batch t is S[start + t*G : start + (t+1)*G].

    The last batch may be short; ranks then read it padded only to a multiple of the world size, in equal
    parts (`rank_batch_positions`).
    """

    def __init__(self, plan: EpochPlan, global_batch_size: int, start: int = 0):
        if int(global_batch_size) != global_batch_size or global_batch_size < 1:
            raise ValueError(f"global batch size must be an integer >= 1, got {global_batch_size!r}")
        if not 0 <= start <= len(plan):
            raise ValueError(f"start={start} is outside the epoch of {len(plan)} samples")
        self.plan, self.global_batch_size, self.start = plan, int(global_batch_size), int(start)
        self.num_batches = -(-(len(plan) - self.start) // self.global_batch_size)

    def samples_consumed(self, batches_done: int) -> int:
        """Samples consumed in the epoch (for `PlanState`) once the first `batches_done` batches are read."""
        return min(len(self.plan), self.start + batches_done * self.global_batch_size)

    def global_positions(self, t: int) -> np.ndarray:
        lo = self.start + t * self.global_batch_size
        return np.arange(lo, min(lo + self.global_batch_size, len(self.plan)), dtype=np.int64)

    def global_batch(self, t: int) -> np.ndarray:
        return self.plan.samples_at(self.global_positions(t))

    def positions_for(self, t: int, rank: int, world_size: int, ranks_per_node: int | None = None) -> np.ndarray:
        """Positions of S that `rank` reads in batch t (see `rank_batch_positions`)."""
        pos = self.rank_batch_positions(np.array([t]), DeviceLayout(world_size, rank, ranks_per_node))[0]
        return pos[pos >= 0]

    def samples_for(self, t: int, rank: int, world_size: int, ranks_per_node: int | None = None) -> np.ndarray:
        return self.plan.samples_at(self.positions_for(t, rank, world_size, ranks_per_node))

    def rank_num_samples(self, rank: int, world_size: int, ranks_per_node: int | None = None) -> int:
        """Samples `rank` reads in this schedule (equal on every rank)."""
        if self.num_batches == 0:
            return 0
        last = self.positions_for(self.num_batches - 1, rank, world_size, ranks_per_node).size
        return (self.num_batches - 1) * (self.global_batch_size // world_size) + last

    def rank_batch_positions(self, ts: np.ndarray, layout: DeviceLayout) -> np.ndarray:
        """Positions of S that `layout`'s rank reads in batches `ts`: shape (len(ts), G/W), -1 where none.

        Full batches split as `rank_positions` says. The last batch, when short, is what MosaicML
        Streaming does with an epoch's tail: padded with the first samples of S only up to a multiple of
        the world size W (fewer than W repeats; none in one process), then split contiguously into W equal
        parts. Every rank reads the same number of samples (DDP never waits on one that ran out) and one
        process reads each sample exactly once, its last batch partial.
        """
        ts = np.asarray(ts, dtype=np.int64)
        n, G, W = len(self.plan), self.global_batch_size, layout.world_size
        pos = rank_positions(self.start + ts * G, G, self.plan.num_lanes, layout.rank, W, layout.ranks_per_node)
        last = self.num_batches - 1
        rest = n - self.start - last * G  # samples in the last batch, 1..G
        if rest < G and len(ts) and ts[-1] == last:
            share = -(-rest // W)  # samples per rank in the padded last batch
            lo = self.start + last * G + layout.rank * share
            pos[-1] = -1
            pos[-1, :share] = (lo + np.arange(share, dtype=np.int64)) % n
        return pos

    def worker_batch_indices(self, layout: DeviceLayout) -> WorkerBatches:
        """Batches this worker serves: DataLoader workers take a rank's batches round-robin."""
        return WorkerBatches(0, self.num_batches, layout)

    def _worker_chunks(self, layout: DeviceLayout) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(batch indices, positions of shape (batches, G/W), -1 where none: `rank_batch_positions`) in chunks."""
        batches = self.worker_batch_indices(layout)
        per_rank = self.global_batch_size // layout.world_size
        step = max(1, CHUNK_SAMPLES // max(1, per_rank))
        for i in range(0, len(batches), step):
            ts = np.asarray(batches[i:i + step], dtype=np.int64)
            yield ts, self.rank_batch_positions(ts, layout)

    def check_layout(self, layout: DeviceLayout) -> None:
        """Raise ValueError now (before any download) if `layout` cannot split this schedule's batches."""
        if self.global_batch_size % layout.world_size:
            raise ValueError(f"global batch size {self.global_batch_size} is not divisible by world size "
                             f"{layout.world_size}; pick a global batch size that every world size you use divides")

    def worker_batches(self, layout: DeviceLayout) -> Iterator[tuple[int, np.ndarray]]:
        """Lazily yield (t, sample ids) for each non-empty rank batch this worker serves, in order."""
        self.check_layout(layout)
        return self._worker_batches(layout)

    def _worker_batches(self, layout: DeviceLayout) -> Iterator[tuple[int, np.ndarray]]:
        for ts, pos in self._worker_chunks(layout):
            valid = pos >= 0
            ids = np.full(pos.shape, -1, dtype=np.int64)
            ids[valid] = self.plan.samples_at(pos[valid])
            for t, row, ok in zip(ts.tolist(), ids, valid, strict=True):
                if ok.any():
                    yield t, row[ok]

    def shard_order(self, layout: DeviceLayout, skip_samples: int = 0, renew: int = 0) -> Iterator[ShardNeed]:
        """Lazily yield each shard this worker will still need, in order of first need (with `renew`,
        again at its first need in every window of `renew` samples: see `first_needs`).

        `sample_index` counts this worker's samples from `skip_samples` on (the samples it has already
        read), so a prefetcher can keep a window ahead and a cache can evict what is needed last.
        """
        self.check_layout(layout)
        return self._shard_order(layout, skip_samples, renew)

    def _shard_order(self, layout: DeviceLayout, skip_samples: int, renew: int = 0) -> Iterator[ShardNeed]:
        chunks = (pos[pos >= 0] for _, pos in self._worker_chunks(layout))
        return first_needs(chunks, self.plan.run.units.shard_sizes.size, skip_samples, self.plan.shards_at, renew)
