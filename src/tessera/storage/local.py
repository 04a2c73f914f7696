"""A folder on local disk as a Store: temp file + rename for atomic writes, fsync for durability."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from tessera.storage.base import Data, ObjectInfo, Store
from tessera.storage.errors import NotFound, StorageError, translate
from tessera.storage.retry import RetryPolicy
from tessera.storage.url import check_key

TMP_MARK = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path_for(dest: Path) -> Path:
    """A hidden sibling of `dest`, so the final rename stays on one file system."""
    return dest.with_name(f".{dest.name}{TMP_MARK}{uuid.uuid4().hex[:12]}")


def write_atomic(path: Path, data: bytes | bytearray | memoryview) -> None:
    """Write a local file so readers see the old file, the whole new one, or nothing (no fsync:
    for caches, where a lost file is fetched again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and TMP_MARK in name


class LocalStore(Store):
    """Objects are files under `root`; in-progress temp files are invisible to `list`."""

    def __init__(self, root: str | Path, retry: RetryPolicy | None = None, fsync: bool = True) -> None:
        self.root = Path(root)
        self.url = str(self.root)
        self.retry = retry or RetryPolicy()
        self.fsync = fsync

    def _path(self, key: str) -> Path:
        return self.root / check_key(key, self.url_for(key) if key else self.url)

    def url_for(self, key: str) -> str:
        return f"{self.root}/{key}"

    def local_path(self, key: str) -> Path:
        return self._path(key)

    def _fail(self, exc: OSError, key: str) -> StorageError:
        return translate(exc, self.url_for(key))

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as exc:
            raise self._fail(exc, key) from exc

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return os.pread(f.fileno(), max(0, end - start), start)
        except OSError as exc:
            raise self._fail(exc, key) from exc

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        try:
            with open(self._path(key), "rb") as f:
                return [os.pread(f.fileno(), max(0, e - s), s) for s, e in ranges]
        except OSError as exc:
            raise self._fail(exc, key) from exc

    def _write_temp(self, dest: Path, data: Data | None, src: Path | None) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path_for(dest)
        try:
            if src is not None:
                shutil.copyfile(src, tmp)
                if self.fsync:
                    with open(tmp, "rb+") as f:
                        os.fsync(f.fileno())
            else:
                with open(tmp, "wb") as f:
                    f.write(data)  # type: ignore[arg-type]
                    if self.fsync:
                        f.flush()
                        os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _commit(self, tmp: Path, dest: Path, exclusive: bool) -> None:
        try:
            if exclusive:
                os.link(tmp, dest)  # fails with EEXIST instead of replacing: the atomic no-clobber
            else:
                os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        if self.fsync:
            _fsync_dir(dest.parent)

    def _put(self, key: str, data: Data | None, src: Path | None, exclusive: bool) -> None:
        dest = self._path(key)
        try:
            self._commit(self._write_temp(dest, data, src), dest, exclusive)
        except OSError as exc:
            raise self._fail(exc, key) from exc

    def put(self, key: str, data: Data) -> None:
        self._put(key, data, None, exclusive=False)

    def put_file(self, key: str, path: str | Path) -> None:
        self._put(key, None, Path(path), exclusive=False)

    def _put_create(self, key: str, data: Data) -> None:
        self._put(key, data, None, exclusive=True)

    def head(self, key: str) -> ObjectInfo:
        try:
            st = self._path(key).stat()
        except OSError as exc:
            raise self._fail(exc, key) from exc
        if not os.path.isfile(self._path(key)):
            raise NotFound(f"{self.url_for(key)}: is a folder, not an object", self.url_for(key))
        mtime = datetime.fromtimestamp(st.st_mtime, tz=UTC)
        return ObjectInfo(key, st.st_size, f"{st.st_mtime_ns:x}-{st.st_size:x}", mtime)

    def list(self, prefix: str = "", *, start_after: str = "") -> Iterator[ObjectInfo]:
        """Objects in S3's order (lexicographic by key), streamed folder by folder, from the prefix's
        deepest folder (a folder of 10,000 runs is not read to list one run's files)."""
        base = prefix.rpartition("/")[0]
        try:
            folder, rel = (self._path(base), base + "/") if base else (self.root, "")
        except StorageError:   # not a key (e.g. 'a//b'): filter from the root, matching nothing
            folder, rel = self.root, ""
        if folder.is_dir():
            yield from self._walk(folder, rel, prefix, start_after)

    def _walk(self, folder: Path, rel: str, prefix: str, start_after: str) -> Iterator[ObjectInfo]:
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return  # removed while we walked
        named = sorted((e.name + ("/" if e.is_dir() else ""), e) for e in entries if not is_temp_name(e.name))
        for name, entry in named:
            key = rel + name
            if not (key.startswith(prefix) or prefix.startswith(key)):
                continue
            if name.endswith("/"):
                if key >= start_after or start_after.startswith(key):
                    yield from self._walk(Path(entry.path), key, prefix, start_after)
                continue
            if key <= start_after:
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            yield ObjectInfo(key, st.st_size, None, datetime.fromtimestamp(st.st_mtime, tz=UTC))

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise self._fail(exc, key) from exc

    def copy(self, src_key: str, dst_key: str) -> None:
        src = self._path(src_key)
        if not src.is_file():
            raise NotFound(f"{self.url_for(src_key)}: no such object", self.url_for(src_key))
        self._put(dst_key, None, src, exclusive=False)

    def child(self, prefix: str) -> LocalStore:
        return LocalStore(self._path(prefix.strip("/")), self.retry, self.fsync)
