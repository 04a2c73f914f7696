"""Background shard storage: assemble, hash, compress, put, confirm — off the producer's thread.

A bounded semaphore caps the shards in flight (`max_pending`), so memory stays bounded however fast
the producer is: `submit` blocks when the store is the bottleneck. Workers finish in any order, but
progress is reported in shard order: the journal only ever names a contiguous prefix of confirmed
shards. Confirmation is a HEAD after the put, checking the stored size, because the commit must never
name an object the store does not actually hold.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

import numpy as np

from tessera.shards.compression import Compression
from tessera.shards.encodings import Buffer
from tessera.shards.errors import WriterError
from tessera.shards.hashing import digest_parts
from tessera.shards.index import FileInfo, ShardEntry
from tessera.shards.layout import shard_basenames, shard_header
from tessera.storage import Store
from tessera.storage.local import temp_path_for


@dataclass(frozen=True)
class ShardTemplate:
    """Everything shards of one writer share: config bytes, codec, digests and the entry's fixed fields."""

    config: bytes
    compression: Compression | None
    entry: ShardEntry  # samples/raw_data/zip_data are filled in per shard


@dataclass
class PendingShard:
    """A cut shard waiting to be stored: its number, per-sample byte sizes and its samples' bytes, in
    pieces (a writer's buffer, or slices of bodies encoded by convert workers) joined only if needed."""

    number: int
    sizes: Sequence[int] | np.ndarray
    parts: list[Buffer]


def put_parts(store: Store, key: str, parts: list[Buffer]) -> None:
    """Store the concatenation of `parts` atomically.

    A local store gets the parts written straight into a temp file that is then renamed (the same
    protocol as `LocalStore.put`, fsync included), which saves joining a 64 MB shard into a new buffer;
    other stores get one joined buffer.
    """
    path = store.local_path(key)
    if path is None:
        store.put(key, parts[0] if len(parts) == 1 else b"".join(parts))
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    durable = getattr(store, "fsync", True)
    try:
        with open(tmp, "wb") as file:
            for part in parts:
                file.write(part)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


_scratch = threading.local()


def _joined(parts: list[Buffer], size: int) -> memoryview:
    """The parts copied into one buffer that each uploader thread reuses from shard to shard (the whole
    shard is compressed as one stream). A fresh 64 MB buffer per shard costs five times the copy itself
    in page faults. Use as a context manager, so the view is released before the next shard."""
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _scratch.buffer = bytearray(size)
    view = memoryview(buffer)
    position = 0
    for part in parts:
        piece = memoryview(part).cast("B")
        view[position:position + piece.nbytes] = piece
        position += piece.nbytes
    return view[:position]


class ShardUploader:
    """Stores shards concurrently and reports confirmed shards in order through `on_progress`."""

    def __init__(self, store: Store, template: ShardTemplate, first_number: int, max_pending: int,
                 on_progress: Callable[[list[ShardEntry]], None]) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self.store = store
        self.template = template
        self._on_progress = on_progress
        self._pool = ThreadPoolExecutor(max_workers=max_pending, thread_name_prefix="tessera-shard")
        self._slots = threading.BoundedSemaphore(max_pending)
        self._lock = threading.Lock()
        self._next = first_number
        self._done: dict[int, ShardEntry] = {}
        self._futures: list[Future[None]] = []
        self.confirmed: list[ShardEntry] = []
        self.error: BaseException | None = None

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise WriterError(f"{self.store.url}: storing a shard failed: {self.error}") from self.error

    def submit(self, shard: PendingShard) -> None:
        """Queue a shard; blocks while `max_pending` shards are already in flight."""
        self.raise_if_failed()
        self._slots.acquire()
        if self.error is not None:
            self._slots.release()
            self.raise_if_failed()
        self._futures = [f for f in self._futures if not f.done()]
        self._futures.append(self._pool.submit(self._run, shard))

    def _run(self, shard: PendingShard) -> None:
        try:
            entry = self._store_shard(shard)
            with self._lock:
                self._done[shard.number] = entry
                advanced = False
                while self._next in self._done:
                    self.confirmed.append(self._done.pop(self._next))
                    self._next += 1
                    advanced = True
                if advanced and self.error is None:
                    self._on_progress(list(self.confirmed))
        except BaseException as err:  # reported to the producer, which raises it
            with self._lock:
                self.error = self.error or err
        finally:
            self._slots.release()

    def _store_shard(self, shard: PendingShard) -> ShardEntry:
        template = self.template
        entry, codec = template.entry, template.compression
        parts: list[Buffer] = [shard_header(template.config, shard.sizes), *shard.parts]
        raw_size = sum(memoryview(part).nbytes for part in parts)
        raw_name, zip_name = shard_basenames(shard.number, entry.format, codec.family if codec else None)
        raw_info = FileInfo(raw_name, raw_size, digest_parts(entry.hashes, parts))
        zip_info = None
        if codec is not None and zip_name is not None:
            with _joined(parts, raw_size) as raw:
                parts = [codec.compress(raw)]
            zip_info = FileInfo(zip_name, len(parts[0]), digest_parts(entry.hashes, parts))
        shard.parts = []  # the producer's buffers are not needed past this point
        key = zip_name or raw_name
        size = sum(memoryview(part).nbytes for part in parts)
        put_parts(self.store, key, parts)
        del parts
        stored = self.store.head(key).size
        if stored != size:
            raise WriterError(f"{self.store.url_for(key)}: stored {stored} bytes, expected {size}")
        return replace(entry, samples=len(shard.sizes), raw_data=raw_info, zip_data=zip_info)

    def wait(self) -> list[ShardEntry]:
        """Wait for every queued shard; the confirmed shards in order, or WriterError."""
        wait(self._futures)
        self._futures = []
        self.raise_if_failed()
        return list(self.confirmed)

    def close(self) -> None:
        """Finish in-flight work (so the journal is accurate) and stop the threads."""
        self._pool.shutdown(wait=True)
