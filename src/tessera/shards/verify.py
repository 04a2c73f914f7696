"""`verify_dataset`: check every shard of a dataset (files present, sizes, hashes, structure, decoding).

Problems are collected, not raised one at a time: a user repairing a dataset wants the whole list, so
index entries that readers refuse as a whole (`samples: 0` hiding samples) are listed too, and the shards
are still checked. An index that cannot be read at all (a file listed twice, a sample count its shard's
bytes cannot hold: index.py refuses it as it parses) is one error. Where `convert` recorded which input rows each shard holds
(provenance.py), rows stored in two shards are problems too: every file is sound, yet readers would see
those samples twice.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tessera.shards.dataset import open_dataset_store, read_index
from tessera.shards.errors import ShardError, ShardFormatError
from tessera.shards.fetch import decompress_file
from tessera.shards.index import INDEX_BASENAME, DatasetIndex, FileInfo, InconsistentIndex, ShardEntry
from tessera.shards.provenance import provenance_problems
from tessera.shards.text_reader import open_shard_reader
from tessera.storage import StorageError, Store, download_from
from tessera.storage.transfer import hash_file


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


def _check_file(path: Path, info: FileInfo, label: str) -> list[str]:
    """Size and every recorded digest of one downloaded file (hashed from disk, not held in memory)."""
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


def _verify_shard(store: Store, shard: int, entry: ShardEntry, tmp: Path, decode: bool,
                  allow_unsafe: bool) -> list[str]:
    stored = entry.stored
    label = f"{store.url_for(stored.basename)} (shard {shard})"
    local = tmp / f"shard-{shard}"
    try:
        download_from(store, stored.basename, local)
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


def _load_index(store: Store) -> tuple[DatasetIndex, list[str]]:
    """The index, and what is wrong with its entries as a whole (listed, so every shard is still checked)."""
    try:
        return read_index(store), []
    except InconsistentIndex:
        label = store.url_for(INDEX_BASENAME)
        index = DatasetIndex.from_json(store.get(INDEX_BASENAME), label, strict=False)
        return index, [str(problem) for problem in index.inconsistencies(label)]


def verify_dataset(url: str | Path | Store, split: str | None = None, *, decode: bool = True,
                   allow_unsafe_types: bool = False,
                   progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check the index and every shard; returns a report listing each problem found."""
    store = open_dataset_store(url, split)
    report = VerifyReport(store.url)
    try:
        index, report.problems = _load_index(store)
    except (ShardFormatError, ShardError, StorageError) as exc:
        report.index_error = str(exc)
        report.problems.append(report.index_error)
        return report
    report.shards, report.samples = len(index.shards), index.num_samples
    report.problems += provenance_problems(index, store.url_for(INDEX_BASENAME))  # source rows stored twice
    with tempfile.TemporaryDirectory(prefix="tessera-verify-") as tmp:
        for shard, entry in enumerate(index.shards):
            report.problems += _verify_shard(store, shard, entry, Path(tmp), decode, allow_unsafe_types)
            for path in Path(tmp).iterdir():
                path.unlink()
            if progress:
                progress(shard + 1, len(index.shards))
    return report
