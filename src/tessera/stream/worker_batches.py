"""The hand-over of batches from DataLoader workers to the training process, as a base of `StreamingDataset`.

A worker does the I/O (plan, prefetch, download, pin) and sends `BatchRefs` naming a group of batches
(gather.py says why: torch's own path costs more than the gathering); the training process turns them
back into batches. Both halves live here, apart from the reading and ordering in dataset.py, because they
are one protocol: what `iter_batch_groups` sends is exactly what `gather_refs` expects.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from tessera.stream.batching.device_layout import group_sizes
from tessera.stream.gather import BatchRefs, gather, gather_to_slot
from tessera.stream.slots import Layout, SlotRing

if TYPE_CHECKING:
    from tessera.shards.reader import ShardReader
    from tessera.stream.open_shards import OpenShards
    from tessera.stream.prefetch import Prefetcher
    from tessera.stream.stage_times import StageTimes


class WorkerBatches:
    """`iter_batch_groups` (a worker's DataLoader items) and `gather_refs` (the training process's batches)."""

    cache_limit: int | None
    stage_times: StageTimes
    _shards: OpenShards

    if TYPE_CHECKING:
        def _reader(self, shard: int, prefetcher: Prefetcher | None = None) -> ShardReader: ...
        def _epoch_batches(self, group: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray, Prefetcher]]: ...
        def iter_batches(self) -> Iterator[dict[str, Any]]: ...

    def iter_batch_groups(self, group: int, refs: bool, ring: SlotRing | None = None,
                          worker: int = 0) -> Iterator[BatchRefs | list[dict[str, Any]]]:
        """DataLoader items: with `refs`, BatchRefs of `group` consecutive per-device batches whose shards
        are all present (the consumer gathers them: `gather_refs`), each gathered here into a slot of
        `ring` (this is worker `worker`) when one is free; else [batch] from `iter_batches`."""
        if not refs:  # through iter_batches, which a subclass may have overridden
            yield from ([batch] for batch in self.iter_batches())
            return
        pending: list[tuple[np.ndarray, np.ndarray]] = []
        data: dict[int, dict[str, Any]] = {}  # batches gathered here: a shard served by ranged reads
        slots: list[tuple[int, Layout] | None] = []
        sizes = group_sizes(group)
        size = next(sizes)
        for shards, local, prefetcher in self._epoch_batches(group):
            t0 = time.perf_counter()
            read = lambda shard, p=prefetcher: self._reader(shard, p)  # noqa: E731
            slots.append(gather_to_slot(ring, worker, read, shards, local, self._shards.rows))  # opens the shards it reads
            for shard in () if slots[-1] else dict.fromkeys(shards.tolist()):  # (cheaper than np.unique)
                read(shard)  # present, pinned and open before anyone is told
            if not slots[-1] and (self.cache_limit is not None or self._shards.ranged.sparse
                                  and self._shards.ranged.sparse.keys() & set(shards.tolist())):
                # Sent as data: its rows came by ranged reads (not in the cache), or under a cache limit,
                # where the shard may be evicted before the training process reads it (which would then
                # download it again, itself).
                data[len(pending)] = gather(read, shards, local, addresses=self._shards.rows)
            pending.append((shards, local))
            self.stage_times.decode += time.perf_counter() - t0
            if len(pending) == size:
                yield BatchRefs.of(pending, data, slots)
                pending, data, slots, size = [], {}, [], next(sizes)

        if pending:
            yield BatchRefs.of(pending, data, slots)

    def gather_refs(self, refs: BatchRefs, ring: SlotRing | None = None) -> Iterator[dict[str, Any]]:
        """The batches a worker named: over its shared slots, or gathered from this process's own mapping
        of the cache files."""
        if ring is not None:
            ring.reclaim()
        for shards, rows, given, slot in refs.items():
            t0 = time.perf_counter()
            if slot is not None:
                yield ring.hand_out(slot[0], slot[1], len(shards))  # type: ignore[union-attr]
            else:
                yield given if given is not None else gather(self._reader, shards, rows, addresses=self._shards.rows)
            self.stage_times.decode += time.perf_counter() - t0  # includes the consumer's time, as above
