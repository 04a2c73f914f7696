"""The shards a reader process holds open: one owner for their readers, pins and row addresses.

A reader process (a rank or a DataLoader worker) reads samples through `ShardReader`s, memory maps of
cached shard files. Each open reader holds a pin on its file (a shared lock the cache's eviction
respects), so a shard is never evicted while it is mapped. Under a cache limit a process keeps only its
share of what fits open, closing the least recently used reader when it opens another, and it pins the
shards it prefetched until it opens them, because the other processes sharing the cache know nothing
of its needs. Ranged reads (ranged.py) put readers of sparse in-memory copies in the same table while
a shard's download runs, so every lookup of an open shard goes through `OpenShards`.

None of it survives pickling: a spawned DataLoader worker opens its own readers.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tessera.shards.reader import ShardReader
from tessera.stream.cache_limit import shards_fit
from tessera.stream.prefetch import Prefetcher
from tessera.stream.ranged import RangedReads
from tessera.stream.row_addresses import RowAddresses
from tessera.stream.stage_times import StageTimes
from tessera.stream.streams import LoadedStream
from tessera.stream.world import World

# Shards kept memory-mapped (and pinned) per reader process. A shuffle block spans many shards, so this
# must cover them all or samples re-open shards; an mmap and a lock fd per shard cost little. Under a
# cache_limit a reader keeps fewer open: its share of what fits (`open_limit`).
OPEN_READERS = 256


def open_limit(cache_limit: int | None, streams: Sequence[LoadedStream], world: World) -> int:
    """Shard readers one process keeps open (each pins its shard, which then cannot be evicted).

    Under a cache limit, every reader process of the node (ranks x DataLoader workers) shares the
    cache: each gets an equal part of what fits, half for open shards and half for shards it
    prefetched (also pinned until opened: `OpenShards.prefetch`), and at least one open. Without that,
    two ranks each pinned nearly a whole limit's worth and the cache grew past it.
    """
    if cache_limit is None:
        return OPEN_READERS
    readers = world.local_world_size * max(1, world.num_workers)
    fits = shards_fit(cache_limit, streams)
    return max(1, min(OPEN_READERS, (fits // readers) // 2))


class OpenShards:
    """Per reader process and dataset: open readers (least recently used first) with their pins, the
    pins of prefetched shards not opened yet, ranged reads and the row table gather copies from."""

    def __init__(self, streams: Sequence[LoadedStream], entries: Sequence[tuple[int, int]], *,
                 columns: list[str] | None, allow_unsafe_types: bool, cache_limit: int | None,
                 ranged_reads: bool, times: StageTimes, max_open: int) -> None:
        self.streams, self.entries = streams, entries
        self.columns, self.allow_unsafe_types, self.cache_limit = columns, allow_unsafe_types, cache_limit
        self.times = times
        self.max_open = max_open  # set again per iteration, once the workers are known
        self.ranged = RangedReads(streams, entries, ranged_reads, columns, allow_unsafe_types)
        self.active: Prefetcher | None = None  # the running iteration's, for reads outside it (`get_item`)
        self._readers: OrderedDict[int, tuple[ShardReader, Any]] = OrderedDict()
        self._ahead: dict[int, Any] = {}  # pins of prefetched shards not opened yet (cache limit only)
        self.rows = RowAddresses()  # where open shards keep their rows, for gather

    def __getstate__(self) -> dict[str, Any]:
        """Open readers (mmaps), pins and the running iteration stay in the process that made them."""
        return {**self.__dict__, "_readers": OrderedDict(), "_ahead": {}, "rows": RowAddresses(), "active": None}

    # --- the cache files -----------------------------------------------------------------------------
    def path(self, shard: int) -> Path:
        si, sh = self.entries[shard]
        return self.streams[si].cache.path(self.streams[si].entries[sh])

    def fetch(self, shard: int, rank_of: Any = None) -> Path:
        si, sh = self.entries[shard]
        return self.streams[si].cache.fetch(self.streams[si].entries[sh], rank_of)

    def prefetch(self, shard: int, rank_of: Any = None) -> Path | None:
        """Fetch ahead of the reader only if it fits under cache_limit without passing it (else None).

        Under a cache limit the shard stays pinned until this process opens it (`reader`): the other
        processes sharing the cache know nothing of this process's needs, so to them an unopened prefetched
        shard looks unneeded, and they evicted it just before it was read (downloaded again).
        """
        si, sh = self.entries[shard]
        cache, entry = self.streams[si].cache, self.streams[si].entries[sh]
        self.ranged.wait_turn()  # the first batch's ranged reads go first (ranged.py)
        if self.cache_limit is None:
            return cache.fetch(entry, rank_of, optional=True)
        if len(self._ahead) >= self.max_open:  # this process's share is held: leave the rest to others
            return None
        pin = cache.pinned(entry)
        pin.__enter__()
        try:
            path = cache.fetch(entry, rank_of, optional=True)
        except BaseException:
            pin.__exit__(None, None, None)
            raise
        if path is None or shard in self._ahead:
            pin.__exit__(None, None, None)
        else:
            self._ahead[shard] = pin
        return path

    def release_ahead(self, shard: int | None = None) -> None:
        """Drop the prefetch pin of `shard` (opened now: its reader holds a pin of its own), or of all."""
        for key in [shard] if shard is not None else list(self._ahead):
            pin = self._ahead.pop(key, None)
            if pin is not None:
                pin.__exit__(None, None, None)

    # --- readers ---------------------------------------------------------------------------------------
    def reader(self, shard: int, prefetcher: Prefetcher | None = None) -> ShardReader:
        """The open reader of `shard`, opening it (and waiting for its download) if needed."""
        prefetcher = prefetcher or self.active  # reads through get_item during an iteration wait on it too
        hit = self._readers.get(shard)
        if hit is not None:
            self._readers.move_to_end(shard)
            return hit[0]
        if prefetcher is not None and self.ranged.on_miss(self, shard, prefetcher):
            return self._readers[shard][0]  # served by ranged reads while its download runs (ranged.py)
        t0 = time.perf_counter()
        si, sh = self.entries[shard]
        # Pin first, then make sure the shard is present: a shard fetched earlier (by the prefetcher or
        # anyone else) may have been evicted since, and once pinned it can no longer be.
        pin = self.streams[si].cache.pinned(self.streams[si].entries[sh])
        pin.__enter__()
        try:
            if prefetcher is not None:
                prefetcher.wait_for(shard)  # do not download twice what is already on its way
            path = self.fetch(shard, prefetcher.rank if prefetcher else None)
            reader = self.streams[si].open_reader(sh, path, self.columns, self.allow_unsafe_types)
        except BaseException:
            pin.__exit__(None, None, None)
            raise
        self.times.wait += time.perf_counter() - t0
        self._readers[shard] = (reader, pin)
        self.release_ahead(shard)
        while len(self._readers) > self.max_open:
            _, (old, old_pin) = self._readers.popitem(last=False)
            old.close()
            old_pin.__exit__(None, None, None)
        return reader

    def held(self, shard: int) -> ShardReader | None:
        """The open reader of `shard`, or None; does not count as a use."""
        hit = self._readers.get(shard)
        return hit[0] if hit is not None else None

    def hold_unpinned(self, shard: int, reader: ShardReader) -> None:
        """Serve `shard` from `reader`, a sparse in-memory copy (ranged.py): no cache file to pin."""
        self._readers[shard] = (reader, _NoPin())

    def forget(self, shard: int, reader: ShardReader) -> bool:
        """Stop serving `shard` from `reader` if it is still the one held; the caller closes it."""
        hit = self._readers.get(shard)
        if hit is None or hit[0] is not reader:
            return False
        del self._readers[shard]
        return True

    def close_shard(self, shard: int) -> None:
        """Close this process's reader of `shard` and drop its pins (before the shard is evicted)."""
        hit = self._readers.pop(shard, None)
        if hit is not None:
            hit[0].close()
            hit[1].__exit__(None, None, None)
        self.release_ahead(shard)

    def close_readers(self) -> None:
        while self._readers:
            _, (reader, pin) = self._readers.popitem()
            reader.close()
            pin.__exit__(None, None, None)

    # --- an iteration ------------------------------------------------------------------------------------
    def batch(self, batches: list[tuple[np.ndarray, np.ndarray]], prefetcher: Prefetcher) -> None:
        """The process is about to read these (shards, rows) batches: ranged reads may serve them."""
        self.ranged.batch(self, batches, prefetcher)

    def end_iteration(self) -> None:
        """Close everything the iteration opened or pinned (its prefetcher is closed by then)."""
        self.active = None
        self.release_ahead()
        self.close_readers()
        self.ranged.close()


class _NoPin:
    """The pin of a sparse copy: there is no cache file to keep from eviction."""

    def __exit__(self, *exc: object) -> None:
        return None
