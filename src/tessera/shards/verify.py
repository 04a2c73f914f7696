"""`verify_dataset`: check every shard of a dataset (files present, sizes, hashes, structure, decoding).

Problems are collected, not raised one at a time: a user repairing a dataset wants the whole list.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tessera.shards.compression import parse_compression
from tessera.shards.dataset import open_dataset_store, read_index
from tessera.shards.errors import ShardError, ShardFormatError
from tessera.shards.hashing import hash_hex
from tessera.shards.index import FileInfo
from tessera.shards.reader import ShardReader
from tessera.storage import StorageError, Store, download_from


@dataclass
class VerifyReport:
    """Outcome of a verification: `problems` is empty when the dataset is sound."""

    url: str
    shards: int = 0
    samples: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_hashes(data: bytes, info: FileInfo, label: str) -> list[str]:
    out = []
    if len(data) != info.bytes:
        out.append(f"{label}: {len(data)} bytes, index.json records {info.bytes}")
    for algo, want in sorted(info.hashes.items()):
        have = hash_hex(algo, data)
        if have != want.lower():
            out.append(f"{label}: {algo} is {have}, index.json records {want}")
    return out


def _verify_shard(store: Store, shard: int, entry, tmp: Path, decode: bool, allow_unsafe: bool) -> list[str]:
    stored = entry.stored
    label = f"{store.url_for(stored.basename)} (shard {shard})"
    local = tmp / f"shard-{shard}"
    try:
        download_from(store, stored.basename, local)
    except StorageError as exc:
        return [f"{label}: cannot read: {exc}"]
    data = local.read_bytes()
    problems = _check_hashes(data, stored, label)
    if problems:
        return problems
    if entry.zip_data is not None:
        try:
            data = parse_compression(entry.compression).decompress(data)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - any codec failure is a finding
            return [f"{label}: does not decompress as {entry.compression}: {exc}"]
        problems = _check_hashes(data, entry.raw_data, f"{label} decompressed")
        if problems:
            return problems
        local.write_bytes(data)
    if entry.format != "mds":
        return []
    try:
        reader = ShardReader(local, entry, allow_unsafe_types=allow_unsafe, label=label, shard=shard)
        if decode:
            for i in range(len(reader)):
                reader.get(i)
        reader.close()
    except (ShardFormatError, ShardError, ValueError) as exc:
        return [str(exc)]
    return []


def verify_dataset(url: str | Path | Store, split: str | None = None, *, decode: bool = True,
                   allow_unsafe_types: bool = False,
                   progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check the index and every shard; returns a report listing each problem found."""
    store = open_dataset_store(url, split)
    report = VerifyReport(store.url)
    try:
        index = read_index(store)
    except (ShardFormatError, ShardError, StorageError) as exc:
        report.problems.append(str(exc))
        return report
    report.shards, report.samples = len(index.shards), index.num_samples
    with tempfile.TemporaryDirectory(prefix="tessera-verify-") as tmp:
        for shard, entry in enumerate(index.shards):
            report.problems += _verify_shard(store, shard, entry, Path(tmp), decode, allow_unsafe_types)
            (Path(tmp) / f"shard-{shard}").unlink(missing_ok=True)
            if progress:
                progress(shard + 1, len(index.shards))
    return report
