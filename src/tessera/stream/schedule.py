"""Who reads which positions of an epoch's sequence S: ranks, nodes and DataLoader workers.

Global batch t of a schedule is S[start + t*G : start + (t+1)*G] for every layout. Its positions are
split among ranks by `rank_positions`, a pure function of (batch start, G, lanes, rank, world size, ranks
per node); a rank's batches are split among its DataLoader workers round-robin (worker w of W serves the
rank's batches t with t % W == w), which is the order in which a torch DataLoader reads them. Resuming is
a new schedule whose `start` is the number of samples already consumed: O(1), whatever the position.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from tessera.stream.plan import EpochPlan

_CHUNK_SAMPLES = 16384  # samples computed per vectorised call when iterating a worker's batches


@dataclass(frozen=True)
class DeviceLayout:
    """Where a reader sits: its rank among `world_size` (nodes of `ranks_per_node`) and its worker."""

    world_size: int = 1
    rank: int = 0
    ranks_per_node: int | None = None  # None: one node
    num_workers: int = 0  # DataLoader workers; 0 means the main process reads (one reader)
    worker_id: int = 0
    group: int = 1  # consecutive batches a worker serves before the next worker's turn (see WorkerBatches)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}")
        per_node = self.world_size if self.ranks_per_node is None else self.ranks_per_node
        if per_node < 1 or self.world_size % per_node:
            raise ValueError(f"ranks_per_node={per_node} must divide world_size={self.world_size}")
        if self.num_workers < 0 or not 0 <= self.worker_id < max(1, self.num_workers):
            raise ValueError(f"need 0 <= worker_id < max(1, num_workers), got worker_id={self.worker_id}, "
                             f"num_workers={self.num_workers}")
        if self.group < 1:
            raise ValueError(f"group must be >= 1, got {self.group}")

    @property
    def nodes(self) -> int:
        return self.world_size // (self.ranks_per_node or self.world_size)


class WorkerBatches:
    """The batches in [first, total) one reader serves, as a lazy sequence of batch indices.

    Workers take turns in groups of `layout.group` consecutive batches: group c = batches
    [first + c*k, first + (c+1)*k) goes to worker c % num_workers. A DataLoader reads its workers
    round-robin, so it receives groups 0, 1, 2, ... and hence batches in order; with k > 1 one
    DataLoader item carries k batches (per-item overhead of torch's worker queues paid once per k).
    k = 1 is plain round-robin over batches. Never materialised: O(1) memory at any epoch size.

    With k > 1 the first rounds are smaller (`group_sizes`: 1, 2, 4, ... batches per worker, then k), so
    the first DataLoader items come quickly on a cold cache (ranged.py serves them sample by sample).
    """

    def __init__(self, first: int, total: int, layout: DeviceLayout) -> None:
        self.first, self.k, self.readers = first, layout.group, max(1, layout.num_workers)
        self.worker = layout.worker_id
        self.ramp = (self.k - 1).bit_length()  # rounds of 1, 2, 4, ... < k batches per worker
        self._ramp_batches = self.readers * ((1 << self.ramp) - 1)  # all workers' batches in those rounds
        self._len = int(sum(np.clip(total - first - self._group_start(np.array([c])), 0, self._size(c))[0]
                            for c in range(self.worker, self.readers * self.ramp, self.readers)))
        n = max(0, total - first - self._ramp_batches)
        groups = -(-n // self.k)
        mine = len(range(self.worker, groups, self.readers))
        self._len += mine * self.k
        if mine and (groups - 1) % self.readers == self.worker:
            self._len -= groups * self.k - n  # this worker has the last group, which may be short

    def _size(self, c: int) -> int:
        return min(self.k, 1 << (c // self.readers))

    def _group_start(self, c: np.ndarray) -> np.ndarray:
        """First batch (from `first`) of group c; groups go round-robin to workers, c % readers."""
        j, w = c // self.readers, c % self.readers
        ramp = self.readers * ((1 << np.minimum(j, self.ramp)) - 1) + w * (1 << np.minimum(j, self.ramp))
        return np.where(j < self.ramp, ramp, self._ramp_batches + (c - self.readers * self.ramp) * self.k)

    def __len__(self) -> int:
        return self._len

    def _at(self, i: np.ndarray) -> np.ndarray:
        i = np.asarray(i, dtype=np.int64)
        in_ramp = i < (1 << self.ramp) - 1
        j_ramp = np.floor(np.log2(i + 1)).astype(np.int64)  # (exact for these small integers)
        j = np.where(in_ramp, j_ramp, self.ramp + (i - (1 << self.ramp) + 1) // self.k)
        offset = np.where(in_ramp, i - ((1 << np.minimum(j_ramp, 62)) - 1), (i - (1 << self.ramp) + 1) % self.k)
        return self.first + self._group_start(self.worker + j * self.readers) + offset

    def __getitem__(self, item: slice | int) -> np.ndarray | int:
        if isinstance(item, slice):
            return self._at(np.arange(*item.indices(self._len), dtype=np.int64))
        index = range(self._len)[item]  # bounds and negative indices as for any sequence
        return int(self._at(np.int64(index)))

    def __iter__(self) -> Iterator[int]:
        for start in range(0, self._len, 1 << 16):
            yield from self[start:start + (1 << 16)].tolist()


def group_sizes(k: int) -> Iterator[int]:
    """Batches in a worker's successive groups (DataLoader items): 1, 2, 4, ... while below k, then k."""
    j = 0
    while (1 << j) < k:
        yield 1 << j
        j += 1
    while True:
        yield k


class ShardNeed(NamedTuple):
    """A shard a reader will need: at its `sample_index`-th sample from now, global position `position`."""

    shard: int
    sample_index: int
    position: int


def first_needs(chunks: Iterable[np.ndarray], num_shards: int, skip_samples: int,
                shard_of: Callable[[np.ndarray], np.ndarray] | None = None, renew: int = 0) -> Iterator[ShardNeed]:
    """Each shard in order of first need over `chunks` (a reader's samples in read order), after the
    first `skip_samples` it has already read.

    With `shard_of`, chunk values are global positions, mapped to shards only past the skip (a deep
    resume maps nothing it skips) and reported as `ShardNeed.position`; without, they are shard ids.
    With `renew` > 0, a shard is reported again at its first need in every window of `renew` samples
    (a batch): under a cache limit eviction must know each shard's *next* need, not only its first.
    """
    seen = np.zeros(num_shards, dtype=bool)
    index = 0
    for flat in chunks:
        lo = max(0, skip_samples - index)
        index_base, index = index, index + flat.size
        flat = flat[lo:]
        if not flat.size:
            continue
        shards = flat if shard_of is None else shard_of(flat)
        if renew:  # one np.unique over keys (window, shard)
            window = (index_base + lo + np.arange(flat.size, dtype=np.int64)) // renew
            keys, first = np.unique(window * num_shards + shards, return_index=True)
            uniq = keys % num_shards
        else:
            uniq, first = np.unique(shards, return_index=True)
            fresh = ~seen[uniq]
            uniq, first = uniq[fresh], first[fresh]
            seen[uniq] = True
        for j in np.argsort(first, kind="stable"):
            at = int(first[j])
            yield ShardNeed(int(uniq[j]), index_base + lo + at - skip_samples,
                            -1 if shard_of is None else int(flat[at]))


def rank_positions(batch_start: np.ndarray | int, global_batch_size: int, num_lanes: int, rank: int,
                   world_size: int, ranks_per_node: int | None = None) -> np.ndarray:
    """Positions of S that `rank` serves from the global batches starting at `batch_start` (shape (..., G/W)).

    With P nodes and ``c = gcd(P, L)``, position g belongs to lane group ``g % c`` (lane ``g % L`` has the
    same residue mod c). The nodes p with ``p % c == x`` serve group x, splitting its positions of the batch
    (in order) contiguously among their ranks. When P divides L (c = P) each node reads only the lanes
    ``l % P == p``; when c = 1 this is the plain contiguous split. Each group holds exactly G/c positions of
    any G consecutive ones because c divides P, which divides G. Positions past the end of S are the
    caller's to drop.
    """
    per_node = ranks_per_node or world_size
    if world_size % per_node or not 0 <= rank < world_size:
        raise ValueError(f"need ranks_per_node ({per_node}) dividing world_size ({world_size}) and "
                         f"0 <= rank ({rank}) < world_size")
    if global_batch_size % world_size:
        raise ValueError(f"global batch size {global_batch_size} is not divisible by world size {world_size}")
    nodes = world_size // per_node
    c = math.gcd(nodes, num_lanes)
    per_rank = global_batch_size // world_size
    node, local = divmod(rank, per_node)
    group, member = node % c, (node // c) * per_node + local
    start = np.asarray(batch_start, dtype=np.int64)
    first = start + (group - start) % c
    return first[..., None] + c * (member * per_rank + np.arange(per_rank, dtype=np.int64))




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
        step = max(1, _CHUNK_SAMPLES // max(1, per_rank))
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
