"""`verify_dataset`: check every shard of a dataset (files present, sizes, hashes, structure, decoding).

Problems are collected, not raised one at a time: a user repairing a dataset wants the whole list, so
index entries that readers refuse as a whole (`samples: 0` hiding samples) are listed too, and the shards
are still checked. An index that cannot be read at all (a file listed twice, a sample count its shard's
bytes cannot hold: index.py refuses it as it parses) is one error. Where `convert` recorded which input
rows each shard holds (provenance.py), rows stored in two shards are problems too: every file is sound,
yet readers would see those samples twice.

At the scale of half a million shards: the index is scanned (index_check.py) rather than parsed into an
object per shard, `index_only` stops there, and the shards are checked in chunks by `workers` processes
(pool.py), each chunk's problems reported in shard order. A shard of a local dataset is checked where it
lies (a compressed one is decompressed into a temporary folder); a remote one is downloaded first.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tessera.shards.dataset import index_bytes, open_dataset_store
from tessera.shards.errors import ShardError, ShardFormatError
from tessera.shards.fetch import decompress_file
from tessera.shards.index import INDEX_BASENAME, FileInfo, ShardEntry
from tessera.shards.index_check import IndexText, scan_index
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


_opened: dict[tuple[str, str | None], Store] = {}  # a worker process's stores, opened once


def check_shards(where: Store | tuple[str, str | None], start: int, items: str, decode: bool,
                 allow_unsafe: bool) -> list[str]:
    """The problems of the shards whose index entries are `items` (JSON array items, the first being
    shard `start`), in shard order. Runs in a worker: `where` is the dataset's (url, split) there, or the
    store itself in this process."""
    store = where if isinstance(where, Store) else _opened.get(where) or _opened.setdefault(
        where, open_dataset_store(*where))
    problems: list[str] = []
    label = store.url_for(INDEX_BASENAME)
    with tempfile.TemporaryDirectory(prefix="tessera-verify-") as tmp:
        for shard, raw in enumerate(json.loads(f"[{items}]"), start):
            entry = ShardEntry.from_json(raw, label, shard)  # valid: the scan checked it
            problems += _verify_shard(store, shard, entry, Path(tmp), decode, allow_unsafe)
            for path in Path(tmp).iterdir():
                path.unlink()
    return problems


def verify_dataset(url: str | Path | Store, split: str | None = None, *, decode: bool = True,
                   allow_unsafe_types: bool = False, progress: Callable[[int, int], None] | None = None,
                   index_only: bool = False, workers: int | None = 1) -> VerifyReport:
    """Check the index and (unless `index_only`) every shard; returns a report listing each problem found.

    `workers` processes check the shards (None: one per CPU for a large index, pool.py; threads when `url`
    is a Store object, which cannot be passed to another process); `progress(done, total)` is called as
    chunks of shards are done, in order.
    """
    store = open_dataset_store(url, split)
    report = VerifyReport(store.url)
    label = store.url_for(INDEX_BASENAME)
    try:
        data = index_bytes(store)
        scan = scan_index(data, label, workers, named=PROVENANCE_KEY.encode() in data)
    except (ShardError, StorageError) as exc:
        return report.refused(str(exc))
    del data
    if scan.error is not None:
        return report.refused(str(scan.error))
    report.shards, report.samples = scan.shards, scan.facts.samples
    report.problems = [str(problem) for problem in scan.facts.hidden]
    if scan.facts.named is not None:  # source rows stored twice
        report.problems += provenance_problems(scan.index.extensions, scan.facts.named, label)
    if not index_only:
        report.problems += _check_all(url, split, store, scan.index, workers, decode, allow_unsafe_types, progress)
    return report


def _check_all(url: str | Path | Store, split: str | None, store: Store, index: IndexText, workers: int | None,
               decode: bool, allow_unsafe: bool, progress: Callable[[int, int], None] | None) -> list[str]:
    """Every shard's problems, in shard order, checked in chunks by a pool (see `verify_dataset`)."""
    workers = auto_workers(workers, len(index), CHECK_MIN_SHARDS)
    threads = not isinstance(url, str | os.PathLike)
    size = max(1, min(MAX_CHUNK, math.ceil(len(index) / (workers * 16))))
    where = store if threads else (os.fspath(url), split)  # type: ignore[arg-type]
    jobs = ((where, lo, items, decode, allow_unsafe) for lo, items in index.chunks(size))
    problems: list[str] = []
    with worker_pool(workers, threads) as pool:
        for i, found in enumerate(ordered_map(pool, check_shards, jobs, workers * AHEAD_PER_WORKER)):
            problems += found
            if progress:
                progress(min(len(index), (i + 1) * size), len(index))
    return problems
