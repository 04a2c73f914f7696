"""Whole-file transfers: atomic, parallel-ranged downloads and uploads with verification.

A single GET stream is limited by one TCP connection and one server thread; splitting a large object
into ranges fetched concurrently and written with `pwrite` into a pre-sized temp file is what makes
a cold cache fill at disk speed. The destination appears only after size (and hash) check out.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import xxhash

from tessera.storage.base import Store
from tessera.storage.errors import IntegrityError
from tessera.storage.local import temp_path_for
from tessera.storage.open import open_store
from tessera.storage.remote import ObjectStore
from tessera.storage.url import split_url

CHUNK = 16 << 20  # 16 MiB ranges with 4 streams came out best in a sweep (benchmarks/RESULTS.md, Storage)
MIN_PART = 2 << 20
MIN_SPLIT = 4 << 20  # below this one GET beats the cost of splitting
MAX_CONCURRENCY = 4  # measured: more streams only add contention on 2 cores
Progress = Callable[[int], None] | None


XXHASH_ALGORITHMS = frozenset(["xxh32", "xxh64", "xxh3_64", "xxh128", "xxh3_128"])
HASHLIB_ALGORITHMS = frozenset(a for a in hashlib.algorithms_available if not a.startswith("shake"))
HASH_ALGORITHMS = HASHLIB_ALGORITHMS | XXHASH_ALGORITHMS


def new_hasher(algo: str) -> Any:
    """A fresh incremental hasher for any hashlib algorithm (not shake) or the xxhash family."""
    if algo in XXHASH_ALGORITHMS:
        return getattr(xxhash, algo)()
    if algo in HASHLIB_ALGORITHMS:
        return hashlib.new(algo)
    raise ValueError(f"unsupported hash {algo!r}; use one of {', '.join(sorted(HASH_ALGORITHMS))}")


def hash_file(path: str | Path, algo: str) -> str:
    h = new_hasher(algo)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                h.update(m)
    return h.hexdigest()


def _verify(tmp: Path, url: str, size: int | None, digest: tuple[str, str] | None) -> None:
    got = tmp.stat().st_size
    if size is not None and got != size:
        raise IntegrityError(f"{url}: expected {size} bytes, got {got}", url)
    if digest is not None:
        algo, want = digest
        have = hash_file(tmp, algo)
        if have != want.lower():
            raise IntegrityError(f"{url}: {algo} mismatch (expected {want}, got {have})", url)


def _preallocate(fd: int, size: int) -> None:
    """Reserve the file's blocks up front: concurrent pwrites into allocated extents run faster than
    into a sparse file, where every write also allocates (benchmarks/RESULTS.md, Storage)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:  # file systems without fallocate
        os.ftruncate(fd, size)


def _fetch_into(store: Store, key: str, fd: int, size: int, progress: Progress, concurrency: int) -> int:
    """Write the object's first `size` bytes into `fd`; returns the byte count actually received."""
    if size <= MIN_SPLIT:
        data = store.get_range(key, 0, size) if size else b""
        os.pwrite(fd, data, 0)
        if progress:
            progress(len(data))
        return len(data)

    def one(start: int) -> int:
        return store.write_range(key, start, min(start + chunk, size), fd, progress)

    chunk = max(MIN_PART, min(CHUNK, -(-size // concurrency)))
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return sum(pool.map(one, range(0, size, chunk)))


def download_from(store: Store, key: str, path: str | Path, *, size: int | None = None,
                  hash: tuple[str, str] | None = None, progress: Progress = None,
                  concurrency: int = MAX_CONCURRENCY) -> int:
    """Download `key` of `store` to `path` atomically; returns the byte count."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    url = store.url_for(key)
    # Always ask for the real size: the temp file is pre-sized, so its length proves nothing, and
    # trusting a caller's wrong `size` would fetch a truncated or zero-padded file and pass.
    total = store.head(key).size
    if size is not None and total != size:
        raise IntegrityError(f"{url}: expected {size} bytes, the object has {total}", url)
    tmp = temp_path_for(dest)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if total:
                _preallocate(fd, total)
            got = _fetch_into(store, key, fd, total, progress, concurrency)
        finally:
            os.close(fd)
        if got != total:  # the object shrank while we read it
            raise IntegrityError(f"{url}: expected {total} bytes, received {got}", url)
        _verify(tmp, url, size, hash)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return total


def download(url: str, path: str | Path, *, size: int | None = None, hash: tuple[str, str] | None = None,
             progress: Progress = None, **store_options: Any) -> int:
    """Fetch one object to a local file: atomic, concurrent ranges for large objects, verified."""
    root, key = split_url(url)
    return download_from(open_store(root, **store_options), key, path, size=size, hash=hash,
                         progress=progress)


def upload(path: str | Path, url: str, *, hash: tuple[str, str] | None = None, **store_options: Any) -> None:
    """Put one local file at `url`; atomic (multipart above 16 MiB completes or leaves nothing)."""
    src = Path(path)
    if hash is not None:
        _verify(src, str(src), None, hash)
    root, key = split_url(url)
    open_store(root, **store_options).put_file(key, src)


def copy_between(src: Store, src_key: str, dst: Store, dst_key: str, progress: Progress = None) -> int:
    """Copy one object between any two stores: server-side within one bucket, else via a temp file."""
    dst_file = dst.local_path(dst_key)
    if dst_file is not None:
        return download_from(src, src_key, dst_file, progress=progress)
    src_file = src.local_path(src_key)
    if src_file is not None:
        dst.put_file(dst_key, src_file)
        size = src_file.stat().st_size
    elif isinstance(src, ObjectStore) and isinstance(dst, ObjectStore) and src.client is dst.client:
        size = src.head(src_key).size
        src.copy_to(src_key, dst, dst_key)
    else:
        with tempfile.TemporaryDirectory(prefix="tessera-cp-") as tmp:
            local = Path(tmp) / "object"
            size = download_from(src, src_key, local)
            dst.put_file(dst_key, local)
        return size
    if progress:
        progress(size)
    return size
