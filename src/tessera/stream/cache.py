"""The node-local shard cache: downloads, pins and eviction, coordinated only through the cache folder.

Several ranks, DataLoader workers and even unrelated jobs may share one cache folder. They coordinate
with `flock`ed files in the cache's state folder (beside it: storage/state_folder.py) and atomic
renames, never shared memory:
- one exclusive lock per shard serialises its download (others wait, then find it present);
- a reader holds a shared lock on the shard's pin file, and eviction only removes a shard whose pin
  it can lock exclusively without waiting, so a shard being read is never evicted (the limit's checks and
  the eviction that keeps to it: cache_limit.py);
- the kernel drops every lock of a process that dies, so `kill -9` leaves nothing that blocks.
A file is valid only next to a stamp naming the index entry it was downloaded for: when the remote
index changes, a cached shard whose entry changed is fetched again instead of being served stale.
With `validate_hash`, every raw shard file is hashed on its first use in a process, wherever it came
from (downloaded now, cached by another process, a local-only dataset): a byte flipped on disk is an
error, never a wrong sample.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import resource
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from tessera.shards.fetch import decompress_file
from tessera.shards.index import INDEX_BASENAME, ShardEntry
from tessera.storage import IntegrityError, Store, download_from
from tessera.storage.local import TMP_MARK, temp_path_for, write_atomic
from tessera.storage.locks import flocked
from tessera.storage.state_folder import state_folder
from tessera.stream.cache_limit import CacheSpace, lock_path, stamp_path
from tessera.stream.integrity import remember_verified, verify_file
from tessera.stream.local_claim import LocalClaim

DOWNLOAD_LOG = "downloads.log"


def raise_open_file_limit() -> None:
    """Each open shard holds an mmap and a pin lock (two fds): lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))



def entry_stamp(entry: ShardEntry) -> str:
    """A short fingerprint of a shard's index entry: changes whenever its bytes may have changed."""
    return xxhash.xxh64(json.dumps(entry.to_json(), sort_keys=True).encode()).hexdigest()


def download_counts(root: str | Path) -> Counter[str]:
    """Downloads per shard basename into the cache folder `root` (a stream's `local`), by every process
    that shared it, from its journal (`ShardCache._log_download`)."""
    try:
        text = (state_folder(root) / DOWNLOAD_LOG).read_text()
    except FileNotFoundError:
        return Counter()
    return Counter(line for line in text.splitlines() if line)


@dataclass
class CacheStats:
    """Counters for the per-stage breakdown users can print (evictions: `CacheSpace.evictions`)."""

    downloads: int = 0
    bytes_downloaded: int = 0
    download_seconds: float = 0.0
    decompress_seconds: float = 0.0
    hits: int = 0


class ShardCache:
    """Shards of one dataset (one stream/split) under `root`, fetched from `remote` on demand.

    With `remote=None` the folder *is* the dataset: nothing is downloaded and nothing is ever evicted
    (it has no other copy).
    """

    def __init__(self, root: str | Path, remote: Store | None, *, cache_limit: int | None = None,
                 validate_hash: str | None = None, keep_zip: bool = False,
                 peer_roots: list[Path] | None = None) -> None:
        self.root = Path(root)
        self.remote = remote
        self.validate_hash = validate_hash
        self.keep_zip = keep_zip
        # Every stream's folder: `cache_limit` bounds their sum, and any of them may be evicted from.
        peers = [Path(p) for p in peer_roots] if peer_roots else [self.root]
        states = {r: state_folder(r) for r in {self.root, *peers}}
        self.meta = states[self.root]
        self.space = CacheSpace(self.root, peers, states, cache_limit if remote is not None else None)
        # Before anything is written to the folder: another remote's live dataset using it is refused.
        self.claim = LocalClaim(self.root, remote.url_for(INDEX_BASENAME)) if remote is not None else None
        self.stats = CacheStats()

    # paths -------------------------------------------------------------------------------
    def path(self, entry: ShardEntry) -> Path:
        return self.root / entry.raw_data.basename

    # queries -----------------------------------------------------------------------------
    def is_ready(self, entry: ShardEntry) -> bool:
        """The raw shard is present and was downloaded for exactly this index entry."""
        path = self.path(entry)
        if self.remote is None:
            return self._local_ready(entry)
        try:
            if path.stat().st_size != entry.raw_data.bytes:
                return False
            return stamp_path(self.meta, entry.raw_data.basename).read_text() == entry_stamp(entry)
        except FileNotFoundError:
            return False

    # fetching ----------------------------------------------------------------------------
    def fetch(self, entry: ShardEntry, rank_of: Callable[[Path], float] | None = None,
              optional: bool = False) -> Path | None:
        """Make the raw shard present locally and return its path (idempotent, process-safe).

        `optional=True` (prefetching) fetches only if the shard fits under cache_limit without passing
        it, and returns None otherwise; a reader's own fetch always proceeds (see `CacheSpace.make_room`).
        """
        if self.is_ready(entry):
            self.stats.hits += 1
            return self.path(entry)
        if self.remote is None:
            return self._unpack_local(entry)
        basename = entry.raw_data.basename
        with flocked(lock_path(self.meta, basename, "dl"), fcntl.LOCK_EX):
            if self.is_ready(entry):  # another process fetched it while we waited
                return self.path(entry)
            self._remove_partial_downloads(entry)
            need = entry.raw_data.bytes + (entry.zip_data.bytes if entry.zip_data else 0)
            if not self.space.make_room(need, rank_of, reserve=basename, optional=optional):
                return None
            try:
                self._download(entry)
            finally:
                self.space.reservation_path(basename).unlink(missing_ok=True)
        return self.path(entry)

    def _local_ready(self, entry: ShardEntry) -> bool:
        """A local-only shard is ready when its raw file is the data itself, or was decompressed from
        the compressed file as it is now (same index entry, size, mtime and inode): a dataset rewritten
        in place is decompressed again rather than served from a stale raw file."""
        path = self.path(entry)
        stamp = self._unpacked_stamp(entry)
        if stamp is None:
            return path.exists()  # uncompressed, or the raw file outlived its compressed copy: the only copy
        try:
            return (path.stat().st_size == entry.raw_data.bytes
                    and stamp_path(self.meta, entry.raw_data.basename).read_text() == stamp)
        except FileNotFoundError:
            return False

    def _unpacked_stamp(self, entry: ShardEntry) -> str | None:
        """The stamp of a raw file decompressed from this shard's local compressed file (None: there is none)."""
        if entry.zip_data is None:
            return None
        try:
            st = (self.root / entry.zip_data.basename).stat()
        except FileNotFoundError:
            return None
        return f"{entry_stamp(entry)}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"

    def _unpack_local(self, entry: ShardEntry) -> Path:
        """A local-only compressed shard: decompress it next to its compressed file, as MosaicML does.

        The compressed file is the only copy of the data, so it is never deleted, whatever keep_zip says.
        The shard's download lock serialises processes; the raw file appears by atomic rename.
        """
        path = self.path(entry)
        if entry.zip_data is None:
            raise FileNotFoundError(f"{path}: shard missing and no remote to fetch it from")
        zip_path = self.root / entry.zip_data.basename
        with flocked(lock_path(self.meta, entry.raw_data.basename, "dl"), fcntl.LOCK_EX):
            if self.is_ready(entry):  # another process decompressed it while we waited
                return path
            stamp = self._unpacked_stamp(entry)
            if stamp is None:
                raise FileNotFoundError(f"{zip_path}: compressed shard missing (and no {path.name}); "
                                        "no remote to fetch it from")
            self._remove_partial_downloads(entry)
            t0 = time.perf_counter()
            decompress_file(zip_path, entry.zip_data, entry.compression, entry.raw_data, path, str(zip_path),
                            None, self._check)
            self.stats.decompress_seconds += time.perf_counter() - t0
            write_atomic(stamp_path(self.meta, entry.raw_data.basename), stamp.encode())
        return path

    def _remove_partial_downloads(self, entry: ShardEntry) -> None:
        """Delete temp files of this shard left by a process that died mid-download or mid-decompress.

        Only a holder of the shard's download lock writes them, and we hold it now, so any that exist
        belong to a dead process; without this, every crash would leave shard-sized files for good.
        """
        for info in (entry.raw_data, entry.zip_data):
            if info is not None:
                dest = self.root / info.basename
                for tmp in dest.parent.glob(f".{glob.escape(dest.name)}{TMP_MARK}*"):
                    tmp.unlink(missing_ok=True)

    def _download(self, entry: ShardEntry) -> None:
        stored = entry.stored
        dest = self.root / stored.basename
        want = None
        if self.validate_hash:
            digest = stored.hashes.get(self.validate_hash)
            if digest is None:
                raise IntegrityError(f"{stored.basename}: index has no {self.validate_hash} hash to validate")
            want = (self.validate_hash, digest)
        t0 = time.perf_counter()
        # A compressed file's digest is checked by _decompress, on the way to the raw file's.
        download_from(self.remote, stored.basename, dest, size=stored.bytes,  # type: ignore[arg-type]
                      hash=want if entry.zip_data is None else None)
        self.stats.download_seconds += time.perf_counter() - t0
        self.stats.downloads += 1
        self.stats.bytes_downloaded += stored.bytes
        if entry.zip_data is not None:
            self._decompress(entry, dest)
        stamp = stamp_path(self.meta, entry.raw_data.basename)
        stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path_for(stamp)
        tmp.write_text(entry_stamp(entry))
        os.replace(tmp, stamp)
        self._log_download(entry.raw_data.basename)
        if self.validate_hash:  # checked on the way in: no need to hash it again at first use
            remember_verified(self.path(entry), self.validate_hash, entry.raw_data.hashes[self.validate_hash])

    def _log_download(self, basename: str) -> None:
        """One line per completed download in the cache's journal (`download_counts`): how often a
        cache limit made a shard come again, across every process sharing the folder. O_APPEND writes of
        one short line are atomic, so concurrent processes never interleave."""
        self.meta.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.meta / DOWNLOAD_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (basename + "\n").encode())
        finally:
            os.close(fd)

    def _decompress(self, entry: ShardEntry, zip_path: Path) -> None:
        t0 = time.perf_counter()
        label = self.remote.url_for(entry.stored.basename) if self.remote else str(zip_path)
        decompress_file(zip_path, entry.stored, entry.compression, entry.raw_data, self.path(entry), label, None,
                        self._check)
        if not self.keep_zip:
            zip_path.unlink(missing_ok=True)
        self.stats.decompress_seconds += time.perf_counter() - t0

    @property
    def _check(self) -> tuple[str, ...]:
        """The hash algorithms a decompression verifies (validate_hash's, or none)."""
        return (self.validate_hash,) if self.validate_hash else ()

    def verify(self, entry: ShardEntry, path: Path | None = None, label: str | None = None) -> None:
        """Check the raw shard file against index.json's `validate_hash` digest on its first use in this
        process (called on every reader open; see integrity.py)."""
        algo = self.validate_hash
        if not algo:
            return
        path = path or self.path(entry)
        want = entry.raw_data.hashes.get(algo)
        if want is None:
            raise IntegrityError(f"{label or path}: index.json records no {algo} digest to validate "
                                 f"(it has {sorted(entry.raw_data.hashes)})", label or str(path))
        verify_file(path, algo, want, label or str(path))

    # pins and eviction -------------------------------------------------------------------
    @contextlib.contextmanager
    def pinned(self, entry: ShardEntry) -> Iterator[None]:
        """Hold a shared pin: eviction skips this shard until the block ends."""
        if self.remote is None:
            yield
            return
        with flocked(lock_path(self.meta, entry.raw_data.basename, "pin"), fcntl.LOCK_SH) as fd:
            os.utime(fd)  # when it was last opened: eviction's tie-break (`CacheSpace._last_use`)
            yield

    def evict(self, entry: ShardEntry) -> bool:
        """Remove a shard's files now (raw, and the compressed copy `keep_zip` kept): MosaicML's
        `evict_shard`. False, and nothing removed, while a reader or a download holds the shard. A local
        folder without a remote is the only copy of its data: refused."""
        if self.remote is None:
            raise ValueError(f"{self.root}: a stream without a remote copy is never evicted from (its "
                             "shard files are the only copy of the data)")
        raw = self.path(entry)
        if raw.exists() and not self.space.try_evict(self.root, raw):
            return False
        if entry.zip_data is not None and not self.space.downloading(self.root, entry.zip_data.basename):
            (self.root / entry.zip_data.basename).unlink(missing_ok=True)
        return True

