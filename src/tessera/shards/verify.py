"""`verify_dataset`: check every shard of a dataset (files present, sizes, hashes, structure, decoding).

Problems are collected, not raised one at a time: a user repairing a dataset wants the whole list, so
index entries that readers refuse as a whole (`samples: 0` hiding samples) are listed too, and the shards
are still checked. An index that cannot be read at all (a file listed twice, a sample count its shard's
bytes cannot hold: index.py refuses it as it parses) is one error. Where `convert` recorded which input
rows each shard holds (provenance.py), rows stored in two shards are problems too: every file is sound,
yet readers would see those samples twice.

At the scale of half a million shards: the index is read into its packed form (packed_index.py: checked
as every reader checks it, one array per field, no object per shard; a remote index.json is downloaded
into a temporary folder first), `index_only` stops there, and the shards are checked in chunks by
`workers` processes (pool.py), each mapping the same packed file, each chunk's problems reported in shard
order. A shard of a local dataset is checked where it lies (a compressed one is decompressed into a
temporary folder); a remote one is downloaded first.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.shards.dataset import index_bytes, open_dataset_store
from tessera.shards.errors import ShardError, ShardFormatError
from tessera.shards.fetch import decompress_file
from tessera.shards.index import INDEX_BASENAME, DatasetIndex, FileInfo, InconsistentIndex, ShardEntry
from tessera.shards.packed_index import PackedIndex, open_packed
from tessera.shards.pool import AHEAD_PER_WORKER, CHECK_MIN_SHARDS, auto_workers, ordered_map, worker_pool
from tessera.shards.provenance import PROVENANCE_KEY, provenance_problems
from tessera.shards.text_reader import open_shard_reader
from tessera.storage import StorageError, Store, download_from
from tessera.storage.transfer import hash_file

MAX_CHUNK = 256  # shards a worker checks per task (fewer when there are few: every worker gets some)


@dataclass
class VerifyReport:
    """Outcome of a verification: `problems` is empty when the dataset is sound."""

    url: str
    shards: int = 0
    samples: int = 0
    problems: list[str] = field(default_factory=list)
    index_error: str | None = None  # index.json itself is unreadable: no shard could be checked

    @property
    def ok(self) -> bool:
        return not self.problems

    def refused(self, error: str) -> VerifyReport:
        """This report, for an index.json that cannot be read at all."""
        self.index_error = error
        self.problems.append(error)
        return self


def _check_file(path: Path, info: FileInfo, label: str) -> list[str]:
    """Size and every recorded digest of one file (hashed from disk, not held in memory)."""
    size = path.stat().st_size
    if size != info.bytes:
        return [f"{label}: {size} bytes, index.json records {info.bytes}"]
    out = []
    for algo, want in sorted(info.hashes.items()):
        try:
            have = hash_file(path, algo)
        except ValueError as exc:
            out.append(f"{label}: cannot check {algo}: {exc}")
            continue
        if have != want.lower():
            out.append(f"{label}: {algo} is {have}, index.json records {want}")
    return out


def _stored_file(store: Store, key: str, tmp: Path, shard: int) -> Path:
    """The shard's stored file on local disk: where it lies in a local folder, else downloaded into `tmp`
    (a missing local file too, so that its error reads as a remote one's)."""
    local = store.local_path(key)
    if local is not None and local.is_file():
        return local
    download_from(store, key, tmp / f"shard-{shard}")
    return tmp / f"shard-{shard}"


def _verify_shard(store: Store, shard: int, entry: ShardEntry, tmp: Path, decode: bool,
                  allow_unsafe: bool) -> list[str]:
    stored = entry.stored
    label = f"{store.url_for(stored.basename)} (shard {shard})"
    try:
        local = _stored_file(store, stored.basename, tmp, shard)
    except StorageError as exc:
        return [f"{label}: cannot read: {exc}"]
    problems = _check_file(local, stored, label)
    if problems:
        return problems
    if entry.zip_data is not None:
        raw = tmp / f"shard-{shard}.raw"
        try:  # streamed and capped at the declared raw size: a decompression bomb is a finding, not an OOM
            decompress_file(local, stored, entry.compression, entry.raw_data, raw, label, None,
                            sorted(entry.raw_data.hashes))
        except ShardFormatError as exc:
            return [str(exc)]
        local = raw
    check = sorted(entry.raw_meta.hashes) if entry.raw_meta else ()  # a text shard's meta file, too
    try:
        reader = open_shard_reader(local, entry, tmp, store, columns=None, allow_unsafe_types=allow_unsafe,
                                   label=label, shard=shard, check=check)
        if decode:
            for i in range(len(reader)):
                reader.get(i)
        reader.close()
    except (ShardFormatError, ShardError, StorageError, ValueError) as exc:
        return [str(exc)]
    return []


_opened: dict[Any, Any] = {}  # a worker process's stores and packed indexes, opened once


def _open(kind: str, how: Any) -> Any:
    """In a worker: the store of (url, split), or the packed index its `__reduce__` reopens (once each)."""
    if (kind, how) not in _opened:
        _opened[kind, how] = open_dataset_store(*how) if kind == "store" else how[0](*how[1])
    return _opened[kind, how]


Entries = Sequence[ShardEntry]
Where = tuple[Store, Entries] | tuple[tuple[str, str | None], tuple[Any, tuple[Any, ...]]]


def check_shards(where: Where, lo: int, hi: int, decode: bool, allow_unsafe: bool) -> list[str]:
    """The problems of shards lo..hi-1, in shard order. Runs in a worker: `where` is (the store, the index's
    entries) in this process, or what opens them in a worker process: (url, split), and the packed
    index's own way of mapping itself again (`PackedIndex.__reduce__`)."""
    store, entries = where
    if not isinstance(store, Store):
        store, entries = _open("store", store), _open("packed", entries)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tessera-verify-") as tmp:
        for shard in range(lo, hi):
            problems += _verify_shard(store, shard, entries[shard], Path(tmp), decode, allow_unsafe)
            for path in Path(tmp).iterdir():
                path.unlink()
    return problems


def packed_index(store: Store, folder: Path) -> PackedIndex:
    """The packed form of the dataset's index.json (IndexFormatError as every reader's): of the file itself
    in a local folder, else of a copy downloaded into `folder`, packed there too."""
    label = store.url_for(INDEX_BASENAME)
    local = store.local_path(INDEX_BASENAME)
    if local is not None:
        if not local.is_file():
            index_bytes(store)  # raises DatasetNotFound, naming the dataset
        return open_packed(local, label)
    local = folder / "index" / INDEX_BASENAME  # packed beside its folder: still inside `folder`
    local.parent.mkdir()
    local.write_bytes(index_bytes(store))
    return open_packed(local, label, beside=True)


def verify_dataset(url: str | Path | Store, split: str | None = None, *, decode: bool = True,
                   allow_unsafe_types: bool = False, progress: Callable[[int, int], None] | None = None,
                   index_only: bool = False, workers: int | None = 1) -> VerifyReport:
    """Check the index and (unless `index_only`) every shard; returns a report listing each problem found.

    `workers` processes check the shards (None: one per CPU from CHECK_MIN_SHARDS shards, pool.py;
    threads when `url` is a Store object, which cannot be passed to another process); `progress(done,
    total)` is called as chunks of shards are done, in order.
    """
    store = open_dataset_store(url, split)
    report = VerifyReport(store.url)
    label = store.url_for(INDEX_BASENAME)
    with tempfile.TemporaryDirectory(prefix="tessera-verify-index-") as tmp:
        try:
            entries: Entries = packed_index(store, Path(tmp))
            extensions = entries.extensions
        except InconsistentIndex:  # listed rather than refused, if it is only samples hidden (see the doc)
            try:
                index = DatasetIndex.from_json(index_bytes(store), label, strict=False)
            except (ShardError, StorageError) as exc:
                return report.refused(str(exc))
            entries, extensions = index.shards, index.extensions
            report.problems += [str(problem) for problem in index.inconsistencies(label)]
        except (ShardError, StorageError) as exc:
            return report.refused(str(exc))
        report.shards, report.samples = len(entries), _samples(entries)
        if PROVENANCE_KEY in extensions:  # source rows stored twice
            named = [(entry.raw_data.basename, entry.samples) for entry in entries]
            report.problems += provenance_problems(extensions, named, label)
        if not index_only:
            report.problems += _check_all(url, split, store, entries, workers, decode, allow_unsafe_types, progress)
    return report


def _samples(entries: Entries) -> int:
    return int(entries.samples.sum()) if isinstance(entries, PackedIndex) else sum(e.samples for e in entries)


def _check_all(url: str | Path | Store, split: str | None, store: Store, entries: Entries, workers: int | None,
               decode: bool, allow_unsafe: bool, progress: Callable[[int, int], None] | None) -> list[str]:
    """Every shard's problems, in shard order, checked in chunks by a pool (see `verify_dataset`)."""
    total = len(entries)
    workers = auto_workers(workers, total, CHECK_MIN_SHARDS)
    threads = not isinstance(url, str | os.PathLike) or not isinstance(entries, PackedIndex)
    size = max(1, min(MAX_CHUNK, math.ceil(total / (workers * 16))))
    where: Where = (store, entries) if threads else ((os.fspath(url), split), entries.__reduce__())  # type: ignore[union-attr]
    jobs = ((where, lo, min(total, lo + size), decode, allow_unsafe) for lo in range(0, total, size))
    problems: list[str] = []
    with worker_pool(workers, threads) as pool:
        for i, found in enumerate(ordered_map(pool, check_shards, jobs, workers * AHEAD_PER_WORKER)):
            problems += found
            if progress:
                progress(min(total, (i + 1) * size), total)
    return problems
