"""The cache limit: how large it must be, and the eviction that keeps the shard cache under it.

Kept apart from the cache's downloads (cache.py) because it is its own protocol: every stream folder of
a dataset shares one `cache_limit`, and every process sharing those folders measures and evicts them
through files in their state folders (storage/state_folder.py), never shared memory:
- a reader holds a shared lock on a shard's pin file, and eviction only removes a shard whose pin it
  can lock exclusively without waiting, so a shard being read is never evicted;
- a download in flight holds its shard's download lock and records its size as a reservation, so the
  bytes it is about to write count before they exist;
- one exclusive lock on the cache makes "measure usage, evict, reserve" a single step.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tessera.shards.index import INDEX_BASENAME
from tessera.storage.local import is_temp_name
from tessera.storage.locks import flocked
from tessera.storage.state_folder import is_state_folder


class CacheLimitError(RuntimeError, ValueError):
    """The cache limit is too small to hold what training needs at once (a ValueError, as in MosaicML)."""


def largest_shard(streams: list[Any]) -> int:
    """Cache bytes one shard of these (loaded) streams needs at most (raw + compressed while decompressed)."""
    return max((st.packed.largest_shard for st in streams if st.remote_store is not None), default=0)


def index_bytes(streams: list[Any]) -> int:
    """Bytes of the index.json files in the cache folders of these (loaded) streams: never evicted, they
    count against the cache limit, as in MosaicML."""
    return sum((st.local_root / INDEX_BASENAME).stat().st_size for st in streams if st.remote_store is not None)


def shards_fit(cache_limit: int, streams: list[Any]) -> int:
    """How many of the largest shard fit under the limit beside the index.json files."""
    return max(0, cache_limit - index_bytes(streams)) // max(1, largest_shard(streams))


def check_cache_limit(cache_limit: int | None, streams: list[Any]) -> None:
    """A limit that cannot hold the index.json files and two of the largest shard could not make
    progress: an error at construction (in MosaicML's words, which its users' code may match)."""
    if cache_limit is None:
        return
    indexes = index_bytes(streams)
    if cache_limit <= indexes:
        raise CacheLimitError(f"Minimum cache usage ({indexes} bytes, the index.json files) is larger than the "
                              f"cache limit ({cache_limit} bytes); raise cache_limit")
    biggest = largest_shard(streams)
    if cache_limit < indexes + 2 * biggest:
        raise CacheLimitError(f"Cache limit ({cache_limit} bytes) is too low. Increase the `cache_limit` to at "
                              f"least {indexes + 2 * biggest} bytes: the index.json files ({indexes} bytes) and "
                              f"twice the largest shard ({biggest} bytes, raw + compressed), without which "
                              "training could not make progress")


def stamp_path(state: Path, basename: str) -> Path:
    """The file naming the index entry a cached shard was downloaded for (in its root's state folder)."""
    return state / "stamps" / (basename.replace("/", "__") + ".stamp")


def lock_path(state: Path, basename: str, kind: str) -> Path:
    """A shard's lock file of this kind ("dl": its download, "pin": its readers) in its root's state folder."""
    return state / "locks" / f"{basename.replace('/', '__')}.{kind}"


class CacheSpace:
    """The bytes of every stream folder (`peer_roots`) that share one `cache_limit`, and their eviction.

    `states` maps each root to its state folder; `root` is the folder of the cache that owns this view
    (its downloads' reservations are recorded there). `evictions` counts the files this process removed.
    """

    def __init__(self, root: Path, peer_roots: list[Path], states: dict[Path, Path],
                 cache_limit: int | None) -> None:
        self.root = root
        self.peer_roots = peer_roots
        self.states = states
        self.cache_limit = cache_limit
        self.evictions = 0

    def _shard_files(self) -> list[tuple[Path, Path]]:
        """(root, file) for every cached shard file under every peer root."""
        out = []
        for root in self.peer_roots:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = [d for d in dirnames if not is_state_folder(d)]
                out.extend((root, Path(dirpath, name)) for name in filenames
                           if name != INDEX_BASENAME and not is_temp_name(name))
        return out

    def usage(self) -> int:
        """Bytes of the cache: shard files and index.json files, as MosaicML counts its `cache_limit`
        (temp files of in-flight downloads excluded)."""
        total = self._index_bytes()
        for _, path in self._shard_files():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def _index_bytes(self) -> int:
        """The index.json files of every peer root: never evicted, but they take their part of the limit."""
        total = 0
        for root in self.peer_roots:
            with contextlib.suppress(FileNotFoundError):
                total += (root / INDEX_BASENAME).stat().st_size
        return total

    def reservation_path(self, basename: str, root: Path | None = None) -> Path:
        """Where a download in flight records the bytes it will take (removed when it ends)."""
        return self.states[root or self.root] / "reserved" / basename.replace("/", "__")

    def _reserved(self) -> int:
        """Bytes reserved by downloads in flight (their temp files are not counted as shard files).

        A reservation is live while its shard's download lock is held; one whose owner died is removed.
        """
        total = 0
        for root in self.peer_roots:
            folder = self.states[root] / "reserved"
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                continue
            for name in names:
                fd = os.open(self.states[root] / "locks" / f"{name}.dl", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:  # a download in flight (maybe one of our own threads)
                        with contextlib.suppress(FileNotFoundError, ValueError):
                            total += int((folder / name).read_text() or 0)
                        continue
                    (folder / name).unlink(missing_ok=True)  # its owner died mid-download
                finally:
                    os.close(fd)
        return total

    def make_room(self, need: int, rank_of: Callable[[Path], float] | None = None, reserve: str | None = None,
                  optional: bool = False) -> bool:
        """Evict unpinned shards, needed-last first, until `need` more bytes fit under the limit.

        Shard files and the reservations of downloads in flight count against the limit; `reserve`
        (a shard basename) records this download's reservation in the same step. When the rest is pinned
        by readers, an `optional` fetch gives up (returns False) and a reader's fetch goes on over the
        limit rather than deadlock: the bound is cache_limit plus one in-flight shard per reader.
        """
        if self.cache_limit is None:
            return True
        if need > self.cache_limit:
            raise CacheLimitError(f"cache_limit {self.cache_limit} bytes cannot hold one shard of {need} "
                                  f"bytes; raise cache_limit")
        with flocked(self.states[self.peer_roots[0]] / "cache.lock", fcntl.LOCK_EX):
            files = self._shard_files()
            used = self._reserved() + self._index_bytes()
            for _, p in files:
                with contextlib.suppress(FileNotFoundError):
                    used += p.stat().st_size
            rank = rank_of or (lambda _path: math.inf)
            # A prefetch evicts only shards needed later than the one it fetches (else it would push out
            # what the reader needs first, to be downloaded again); a reader's own fetch any unpinned one.
            own = rank(self.root / reserve) if optional and reserve is not None else -math.inf
            # Highest rank = needed furthest in the future (inf: not needed again this epoch): evict first;
            # among equal ranks (every shard this process does not know a need of, such as those other
            # processes sharing the cache read or prefetched), the least recently used first.
            order = sorted(((rank(path), -self._last_use(root, path), root, path) for root, path in files),
                           key=lambda item: item[:2], reverse=True)
            for need_at, _, root, path in order:
                if used + need <= self.cache_limit or need_at <= own:
                    break
                used -= self.try_evict(root, path)
            if used + need > self.cache_limit and optional:
                return False
            if reserve is not None:
                target = self.reservation_path(reserve)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(str(need))
        return True

    def _last_use(self, root: Path, path: Path) -> float:
        """When a shard was last downloaded or opened by any process (file and pin-lock mtimes)."""
        times = [0.0]
        for p in (path, lock_path(self.states[root], path.relative_to(root).as_posix(), "pin")):
            with contextlib.suppress(FileNotFoundError):
                times.append(p.stat().st_mtime)
        return max(times)

    def downloading(self, root: Path, basename: str) -> bool:
        """Whether a download holds this file's shard: the file itself, or a compressed file being
        decompressed (its download lock is the raw name's, the compressed name less its extension).
        Evicting that compressed file mid-decompression failed the download ("compressed shard file is
        missing"), seen with two ranks of two workers sharing a 10% cache."""
        for name in {basename, basename.rsplit(".", 1)[0]}:
            try:  # a lock file that does not exist is not held (and is not created here)
                fd = os.open(lock_path(self.states[root], name, "dl"), os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            finally:
                os.close(fd)
        return False

    def try_evict(self, root: Path, path: Path) -> int:
        """Remove one shard file unless a reader or a download holds it; the bytes freed (0: kept)."""
        basename = path.relative_to(root).as_posix()
        lock = lock_path(self.states[root], basename, "pin")
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # someone is reading it
            if self.downloading(root, basename):
                return 0
            try:
                size = path.stat().st_size
                stamp_path(self.states[root], basename).unlink(missing_ok=True)  # invalid first, then gone
                path.unlink()
            except FileNotFoundError:
                return 0
            self.evictions += 1
            return size
        finally:
            os.close(fd)
