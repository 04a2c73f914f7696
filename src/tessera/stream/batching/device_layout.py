"""Who reads which positions of a global batch: ranks, nodes and DataLoader workers.

Global batch t of a schedule is S[start + t*G : start + (t+1)*G] for every layout. Its positions are
split among ranks by `rank_positions`, a pure function of (batch start, G, lanes, rank, world size, ranks
per node); a rank's batches are split among its DataLoader workers round-robin (`WorkerBatches`), which is
the order in which a torch DataLoader reads them. Every batching method splits its batches this way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

CHUNK_SAMPLES = 16384  # samples computed per vectorised call when iterating a worker's batches


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
