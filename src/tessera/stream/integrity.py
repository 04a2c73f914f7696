"""`validate_hash` in the streaming path: every raw shard file is hashed on its first use in a process.

MosaicML checks a shard's hash only right after downloading it, so a file already in the cache (put
there by an earlier job, or corrupted on disk since) and every file of a local-only dataset are served
unchecked. Here the reader's open checks the file, wherever it came from, and this process remembers
what it checked, so the cost is one hash per shard file per process, not one per open.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path

from tessera.shards.index import ShardEntry
from tessera.storage import IntegrityError
from tessera.storage.transfer import new_hasher

# Files this process hashed and found right: (path, algorithm, digest, device, inode, size, mtime). A file
# replaced or rewritten gets a new key and is hashed again; so does one checked against another digest.
_VERIFIED: set[tuple[str, str, str, int, int, int, int]] = set()


def _key(path: Path, algo: str, want: str, st: os.stat_result) -> tuple[str, str, str, int, int, int, int]:
    return (str(path), algo, want.lower(), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def check_hash_recorded(layouts: Sequence[tuple[int, ShardEntry]], algo: str | None, label: str) -> None:
    """validate_hash names an algorithm every shard's files record in index.json (else nothing could be
    checked): an error at start-up naming the index, instead of a failure at some later shard. Checked on
    the first shard of each layout (`PackedIndex.layout_shards`): the shards of a layout record the same
    hash names."""
    if not algo:
        return
    new_hasher(algo)  # ValueError listing the supported algorithms
    for shard, entry in layouts:
        for info in (entry.raw_data, entry.zip_data):
            if info is not None and algo not in info.hashes:
                raise IntegrityError(f"{label}: validate_hash={algo!r} but shard {shard} ({info.basename}) "
                                     f"records only {sorted(info.hashes) or 'no hashes'}; pass one of those, "
                                     "or validate_hash=None", label)


def remember_verified(path: Path, algo: str, want: str) -> None:
    """Record a file checked on its way in (a download or decompression verified its digest)."""
    try:
        _VERIFIED.add(_key(path, algo, want, path.stat()))
    except FileNotFoundError:
        pass  # evicted already: the next use fetches and checks it again


def verify_file(path: Path, algo: str, want: str, label: str) -> None:
    """Hash `path` unless this process already found this version of it right; IntegrityError (a
    ValueError, as MosaicML raises for a checksum failure) names the file and the algorithm."""
    try:
        if _key(path, algo, want, path.stat()) in _VERIFIED:
            return
    except FileNotFoundError:
        return  # a missing file is the reader's error to report
    with open(path, "rb") as file:  # hash and stat one open file: the key names what was hashed
        st = os.fstat(file.fileno())
        hasher = new_hasher(algo)
        if st.st_size:
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                hasher.update(data)
    got = hasher.hexdigest()
    if got != want.lower():
        raise IntegrityError(f"{label}: {algo} digest of {path} is {got} but index.json records {want}: the "
                             "file changed after it was written or downloaded; delete it (a cached copy is "
                             "fetched again) or rewrite the dataset", label)
    _VERIFIED.add(_key(path, algo, want, st))
