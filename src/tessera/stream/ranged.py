"""Ranged reads: serve samples of shards still downloading by fetching just those samples.

A shuffled epoch's first batches take one sample from each lane, so they need samples from many shards
at once; waiting for each whole shard (64 MB) made the time to the first batch that of downloading
them all. While a shard's whole download is in flight (started by this reader's prefetcher), the rows a
batch needs from it are fetched with one ranged GET each (adjacent rows merged), concurrently, into a
*sparse* in-memory copy of the shard: a memfd of the shard's size, of which only the header (count,
offsets, config JSON) and the fetched rows are ever written, so only those pages use memory. A normal
`ShardReader` maps it, so decoding, `gather` and the bytes served are exactly those of the cached file.
The header is read first where it is needed to find the rows; when every column is fixed-size the
offsets follow from index.json, so the header comes in the same round of requests as the first rows
(one round trip, not two) and is checked against them before the reader opens.
Once the download is done, the sparse copy is dropped and the shard is read from the cache as before.

Not used (the reader waits for the whole shard as before) for: compressed shards (`zip_data`: a
compressed stream cannot be range-read), `validate_hash` (ranged bytes cannot be checked against the
shard's hash), local-only streams, a shard whose download is not in flight (no prefetch, or skipped
under cache_limit), batches waiting for less than `MIN_MISSING_BYTES` of shards, beyond `MAX_SAMPLES`
samples per epoch or `MAX_BYTES` of ranged rows per reader process, and where `os.memfd_create` is
missing (not Linux).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tessera.shards.errors import CorruptShard
from tessera.shards.reader import ShardReader

# Ranged rows kept in memory per reader process (pages actually written); beyond, readers wait for shards.
MAX_BYTES = 256 << 20
# Samples a reader serves by ranged reads per epoch: the first batches (a DataLoader worker's first two
# items, 1 + 2 batches of 64). Beyond, batches wait for whole shards: each small GET costs the server
# about as much CPU as megabytes of a whole-shard download, and on 2 cores more of them slowed the
# downloads (and so the epoch) by more than they saved (benchmarks/RESULTS.md, Streaming).
MAX_SAMPLES = 256
# Ranged reads start only when the shards a batch waits for hold at least this many bytes: a batch that
# waits for one or two shards gets them about as fast as ranged reads would (header + samples), and the
# extra small requests slowed the rest of the epoch here (benchmarks/RESULTS.md, Streaming).
MIN_MISSING_BYTES = 256 << 20
# Concurrent ranged GETs per reader process (each is a small request: latency-bound, not bandwidth-bound).
CONCURRENCY = 64
# Bytes read with the offset table in the first header request, for the config JSON that follows it.
CONFIG_GUESS = 16 << 10
PAGE = mmap.PAGESIZE


class ReaderTable(Protocol):
    """The process's open readers (`open_shards.OpenShards`), where sparse copies are served from."""

    def held(self, shard: int) -> ShardReader | None: ...
    def hold_unpinned(self, shard: int, reader: ShardReader) -> None: ...
    def forget(self, shard: int, reader: ShardReader) -> bool: ...


@dataclass
class SparseShard:
    """The in-memory sparse copy of one shard: header written, `have[i]` when row i is.

    A shard whose offsets follow from index.json (`_computed_offsets`) starts without its header and
    reader (`reader` None, `fd` open): the header is fetched together with the first rows, checked, and
    only then is the reader opened (`_finish`)."""

    reader: ShardReader | None
    buffer: mmap.mmap  # writable shared mapping of the memfd (the reader maps it read-only)
    offsets: np.ndarray  # int64, N + 1
    have: np.ndarray  # bool, N
    key: str
    store: Any
    cost: int  # bytes (whole pages) counted against MAX_BYTES
    fd: int | None = None  # the memfd, until the reader has opened it


class RangedReads:
    """Per reader process: which shards are currently served from sparse copies, and their fetches."""

    def __init__(self, streams: Sequence[Any], entries: Sequence[tuple[int, int]], enabled: bool,
                 columns: list[str] | None, allow_unsafe_types: bool) -> None:
        self.streams, self.entries = streams, entries
        self._columns, self._unsafe = columns, allow_unsafe_types
        self.enabled = enabled and hasattr(os, "memfd_create")
        self.sparse: dict[int, SparseShard] = {}
        self.held = 0  # bytes (whole pages) of rows and headers written into sparse copies
        self.served = 0  # samples served by ranged reads (rows fetched), for tests and the profile
        self._epoch_served = 0
        self.prepared_for: Any = None
        self._current: tuple[np.ndarray, np.ndarray] | None = None
        self._go: threading.Event | None = threading.Event() if self.enabled else None  # see wait_turn
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        """Sparse copies, counters and the pool belong to the process that made them."""
        return {**self.__dict__, "sparse": {}, "held": 0, "served": 0, "_epoch_served": 0, "prepared_for": None,
                "_current": None, "_pool": None, "_pid": 0, "_go": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _go=threading.Event() if state["enabled"] else None)

    def eligible(self, shard: int) -> bool:
        si, sh = self.entries[shard]
        st = self.streams[si]
        entry = st.entries[sh]
        return (self.enabled and st.remote_store is not None and entry.zip_data is None and entry.format == "mds"
                and not st.cache.validate_hash and entry.samples > 0)

    def _bytes(self, shard: int) -> int:
        si, sh = self.entries[shard]
        return self.streams[si].entries[sh].raw_data.bytes

    def _cached(self, shard: int) -> bool:
        si, sh = self.entries[shard]
        return self.streams[si].cache.is_ready(self.streams[si].entries[sh])

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pid != os.getpid():  # threads do not survive fork()
            self._pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="tessera-ranged")
            self._pid = os.getpid()
        return self._pool

    def close(self) -> None:
        self.sparse.clear()
        self._current = self.prepared_for = None
        self._epoch_served = self.held = 0
        if self._go is not None:
            self._go.clear()
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None

    # --- the per-batch step ---------------------------------------------------------------------------
    def batch(self, readers: ReaderTable, batches: list[tuple[np.ndarray, np.ndarray]],
              prefetcher: Any) -> None:
        """The reader is about to serve these batches ((shards, rows) each; a DataLoader worker's group):
        remember them, and if sparse copies are in use, refresh them and fetch the rows they need. Nothing
        else when no sparse copy is in use: this runs thousands of times a second."""
        if self._go is not None and self._current is not None and not self._go.is_set():  # past the first batch
            self._go.set()  # downloads go (set once: Event.set takes a lock and notifies every time)
        if len(batches) == 1:
            self._current = batches[0]
        else:
            self._current = (np.concatenate([s for s, _ in batches]), np.concatenate([r for _, r in batches]))
        if self.sparse:
            self.prepare(readers, *self._current, prefetcher)

    def wait_turn(self) -> None:
        """Called by prefetch threads before a whole-shard download. At the start of an epoch, downloads
        wait (at most 1 s) until the first batches' ranged reads are done: on a loaded machine, a few 64 MB
        downloads starting at the same moment made those small requests several times slower."""
        if self._go is not None:
            self._go.wait(1.0)

    def on_miss(self, readers: ReaderTable, shard: int, prefetcher: Any) -> bool:
        """`shard` is not open: serve the current batch's shards by ranged reads where they can be; True
        if `shard` now is (readers holds its sparse copy)."""
        if not self.enabled or self._current is None or self.prepared_for is self._current[0]:
            return False
        self.prepare(readers, *self._current, prefetcher)
        return readers.held(shard) is not None

    def prepare(self, readers: ReaderTable, shards: np.ndarray, rows: np.ndarray,
                prefetcher: Any) -> None:
        """Make every shard of this batch readable through `readers` without waiting for a download,
        where it can: drop sparse copies whose download has finished (or that `readers` evicted), start
        sparse copies of shards whose download is in flight, and fetch the rows this batch needs."""
        self.prepared_for = shards
        try:
            self._prepare(readers, shards, rows, prefetcher)
        finally:
            if self._go is not None:  # the first batch's ranged reads are done (or were not needed)
                self._go.set()

    def _prepare(self, readers: ReaderTable, shards: np.ndarray, rows: np.ndarray,
                 prefetcher: Any) -> None:
        for shard, sp in list(self.sparse.items()):
            if sp.reader is None or readers.held(shard) is not sp.reader or not prefetcher.pending(shard):
                self._drop(readers, shard)
        fresh = [s for s in dict.fromkeys(shards.tolist()) if self._epoch_served < MAX_SAMPLES and readers.held(s) is None
                 and self.eligible(s) and prefetcher.pending(s) and not self._cached(s)]
        if sum(self._bytes(s) for s in fresh) + sum(self._bytes(s) for s in self.sparse) < MIN_MISSING_BYTES:
            fresh = []
        if not fresh and not self.sparse:
            return
        pool = self._executor()
        quick = {s: offsets for s in fresh if (offsets := self._computed_offsets(s)) is not None}
        slow = [s for s in fresh if s not in quick]  # their header first: it holds the offsets
        for shard, made in zip(slow, list(pool.map(self._open, slow)), strict=True):
            self.sparse[shard] = made
            readers.hold_unpinned(shard, made.reader)  # type: ignore[arg-type]
        for shard, offsets in quick.items():
            sp = self.sparse[shard] = self._blank(shard, offsets)
            self.held += sp.cost
        jobs: list[tuple[int, SparseShard, int, int, np.ndarray]] = []
        budget = MAX_SAMPLES - self._epoch_served
        for shard in [s for s in dict.fromkeys(shards.tolist()) if s in self.sparse]:
            sp = self.sparse[shard]
            need = np.unique(rows[shards == shard])
            need = need[~sp.have[need]]
            if not len(need):
                continue
            cost = int(np.sum((sp.offsets[need + 1] - sp.offsets[need]) // PAGE + 2) * PAGE)
            if self.held + cost > MAX_BYTES or budget < len(need):  # this shard waits for its download
                self._drop(readers, shard)
                continue
            self.held += cost
            budget -= len(need)
            sp.cost += cost
            runs = np.split(need, np.flatnonzero(np.diff(need) != 1) + 1)  # adjacent rows: one request
            jobs.extend((shard, sp, int(sp.offsets[r[0]]), int(sp.offsets[r[-1] + 1]), r) for r in runs)
        heads = [sp for shard, sp in self.sparse.items() if shard in quick]  # not dropped above
        for job in [pool.submit(self._fetch_head, sp) for sp in heads] + [pool.submit(self._fetch_rows, j)
                                                                         for j in jobs]:
            job.result()
        for shard in [s for s in quick if s in self.sparse]:
            self._finish(readers, shard)
        for _, sp, _, _, run in jobs:
            sp.have[run] = True
            self.served += len(run)
            self._epoch_served += len(run)

    def _drop(self, readers: ReaderTable, shard: int) -> None:
        sp = self.sparse.pop(shard)
        self.held -= sp.cost  # freed once batches that still view its rows are gone (gather copies them)
        if sp.fd is not None:
            os.close(sp.fd)
            sp.fd = None
        if sp.reader is not None and readers.forget(shard, sp.reader):
            sp.reader.close()

    def _computed_offsets(self, shard: int) -> np.ndarray | None:
        """The offsets of a shard whose columns are all fixed-size, from index.json alone: every sample
        is sum(column_sizes) bytes and the samples end the file, so the first request can fetch rows and
        the header at once (one round trip instead of two). None when a column varies in size or the
        numbers leave no room for a header (then the header is read first, as for any shard)."""
        si, sh = self.entries[shard]
        entry = self.streams[si].entries[sh]
        if any(size is None for size in entry.column_sizes):
            return None
        n, sample = entry.samples, sum(entry.column_sizes)
        start = entry.raw_data.bytes - n * sample
        if start < 4 * (n + 2):
            return None
        return start + sample * np.arange(n + 1, dtype=np.int64)

    def _blank(self, shard: int, offsets: np.ndarray) -> SparseShard:
        """A sparse copy with nothing written yet (header and rows come next, concurrently)."""
        si, sh = self.entries[shard]
        st = self.streams[si]
        entry = st.entries[sh]
        fd = os.memfd_create(f"tessera-ranged-{shard}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, entry.raw_data.bytes)
            buffer = mmap.mmap(fd, entry.raw_data.bytes)
        except BaseException:
            os.close(fd)
            raise
        cost = (int(offsets[0]) // PAGE + 1) * PAGE  # counted against MAX_BYTES by the caller
        return SparseShard(None, buffer, offsets, np.zeros(entry.samples, bool), entry.raw_data.basename,
                           st.remote_store, cost, fd)

    def _attach_reader(self, sp: SparseShard, shard: int) -> None:
        """Open the ShardReader of a sparse copy whose header is written (it parses the header and checks
        the embedded config against index.json); the memfd is closed either way (the mappings keep it)."""
        si, sh = self.entries[shard]
        try:
            sp.reader = self.streams[si].open_reader(sh, Path(f"/proc/self/fd/{sp.fd}"), self._columns,
                                                     self._unsafe)
        finally:
            os.close(sp.fd)  # type: ignore[arg-type]
            sp.fd = None

    def _finish(self, readers: ReaderTable, shard: int) -> None:
        """After the header of a blank copy landed: check it against the computed offsets, then open the
        reader (which parses it and checks the embedded config against index.json)."""
        sp = self.sparse[shard]
        n = len(sp.have)
        head = np.frombuffer(sp.buffer, "<u4", n + 2, 0).astype(np.int64)
        if head[0] != n or not np.array_equal(head[1:], sp.offsets):
            self._drop(readers, shard)
            raise CorruptShard(sp.store.url_for(sp.key), f"ranged read: the header (count {head[0]}, offsets "
                               f"{head[1]}..{head[-1]}) is not what index.json implies ({n} samples of "
                               f"{int(sp.offsets[1] - sp.offsets[0])} bytes); the shard or its index entry is "
                               "corrupt", shard)
        try:
            self._attach_reader(sp, shard)
        except BaseException:
            self._drop(readers, shard)
            raise
        readers.hold_unpinned(shard, sp.reader)  # type: ignore[arg-type]

    # --- I/O (pool threads) -------------------------------------------------------------------------
    @staticmethod
    def _fetch_head(sp: SparseShard) -> None:
        end = int(sp.offsets[0])
        data = memoryview(sp.store.get_range_buffer(sp.key, 0, end)).cast("B")
        if len(data) != end:
            raise CorruptShard(sp.store.url_for(sp.key), f"ranged read of the header [0, {end}) returned "
                               f"{len(data)} bytes", None)
        sp.buffer[:end] = data

    def _open(self, shard: int) -> SparseShard:
        """Read and check the shard's header (count, offsets, config) into a new sparse copy."""
        si, sh = self.entries[shard]
        st = self.streams[si]
        entry = st.entries[sh]
        store, key, size, n = st.remote_store, entry.raw_data.basename, entry.raw_data.bytes, entry.samples
        label = store.url_for(key)
        table_end = 4 * (n + 2)
        if size < table_end:
            raise CorruptShard(label, f"index.json records {size} bytes, too few for the header of {n} "
                               "samples", shard)
        head = bytes(store.get_range_buffer(key, 0, min(size, table_end + CONFIG_GUESS)))
        (count,) = struct.unpack_from("<I", head, 0)
        offsets = np.frombuffer(head, "<u4", n + 1, 4).astype(np.int64)
        if count != n or offsets[0] < table_end or offsets[-1] != size or np.any(np.diff(offsets) < 0):
            raise CorruptShard(label, f"ranged read: the header (count {count}, offsets {offsets[0]}.."
                               f"{offsets[-1]}) does not match index.json ({n} samples, raw_data.bytes {size}); "
                               "the shard or its index entry is corrupt", shard)
        if offsets[0] > len(head):
            head += bytes(store.get_range_buffer(key, len(head), int(offsets[0])))
        sp = self._blank(shard, offsets)
        sp.buffer[: int(offsets[0])] = head[: int(offsets[0])]
        self._attach_reader(sp, shard)
        with _HELD_LOCK:  # (pool threads)
            self.held += sp.cost
        return sp

    @staticmethod
    def _fetch_rows(job: tuple[int, SparseShard, int, int, np.ndarray]) -> None:
        shard, sp, start, end, _ = job
        data = memoryview(sp.store.get_range_buffer(sp.key, start, end)).cast("B")
        if len(data) != end - start:
            raise CorruptShard(sp.store.url_for(sp.key), f"ranged read of bytes [{start}, {end}) returned "
                               f"{len(data)} bytes: the object is shorter than its offsets say", shard)
        sp.buffer[start:end] = data


_HELD_LOCK = threading.Lock()
