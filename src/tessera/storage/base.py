"""The Store interface every backend implements, and the metadata it returns."""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tessera.storage.errors import AlreadyExists
from tessera.storage.retry import RetryPolicy
from tessera.storage.url import check_key

Data = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ObjectInfo:
    """What a HEAD or a listing tells about one object; `key` is relative to the store root."""

    key: str
    size: int
    etag: str | None = None
    last_modified: datetime | None = None


class Store(abc.ABC):
    """Bytes under one root (a folder, or a bucket and prefix). Keys are relative, '/'-separated.

    Writes are atomic: a reader sees the old object, the complete new one, or nothing, never a torn
    write. Transient failures are retried per `retry`; permanent ones raise a StorageError at once.
    """

    url: str
    retry: RetryPolicy

    @abc.abstractmethod
    def get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object."""

    @abc.abstractmethod
    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several [start, end) ranges, fetched concurrently where the backend allows."""

    def get_range_buffer(self, key: str, start: int, end: int) -> Data:
        """Like get_range, but may return a zero-copy buffer (for pwrite into a file)."""
        return self.get_range(key, start, end)

    def write_range(self, key: str, start: int, end: int, fd: int,
                    progress: Callable[[int], object] | None = None) -> int:
        """Bytes [start, end) of the object written at the same offsets of file `fd`; the count received.
        Object stores stream it (see ObjectStore.write_range): memory stays O(chunk), not O(range)."""
        data = self.get_range_buffer(key, start, end)
        os.pwrite(fd, data, start)
        if progress:
            progress(len(memoryview(data)))
        return len(memoryview(data))

    @abc.abstractmethod
    def put(self, key: str, data: Data) -> None: ...

    @abc.abstractmethod
    def put_file(self, key: str, path: str | Path) -> None:
        """Upload a local file; large files go up in concurrent parts (still atomic)."""

    @abc.abstractmethod
    def _put_create(self, key: str, data: Data) -> None:
        """Write only if absent; raise AlreadyExists otherwise."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo: ...

    @abc.abstractmethod
    def list(self, prefix: str = "", *, start_after: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix` (and sorts after `start_after`: S3's StartAfter, so
        a reader polling for new keys gets only those), recursively, streamed page by page."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; removing an absent one is not an error."""

    @abc.abstractmethod
    def copy(self, src_key: str, dst_key: str) -> None: ...

    @abc.abstractmethod
    def child(self, prefix: str) -> Store:
        """A store rooted at `prefix` under this one, sharing its client."""

    @abc.abstractmethod
    def url_for(self, key: str) -> str: ...

    def put_if_absent(self, key: str, data: Data) -> bool:
        """Write `data` only if `key` does not exist; True if this call wrote it.

        Conditional on every backend here (O_EXCL-like link locally, If-None-Match on S3/GCS/Azure),
        so two writers racing for one key cannot both win.
        """
        try:
            self._put_create(key, data)
        except AlreadyExists:
            return False
        return True

    def exists(self, key: str) -> bool:
        from tessera.storage.errors import NotFound

        try:
            self.head(key)
        except NotFound:
            return False
        return True

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for key in keys:  # validate every key first: a bad one must not leave the batch half-deleted
            check_key(key, self.url_for(key) if key else self.url)
        for key in keys:
            self.delete(key)

    def local_path(self, key: str) -> Path | None:
        """The file backing `key` when the store is a local folder (so callers can mmap it)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
