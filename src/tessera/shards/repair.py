"""Rebuild a lost index.json from the shard files themselves.

Every MDS shard embeds its writer's config (columns, encodings, compression, hash algorithms, size
limit), and JSON/CSV/TSV/XSV shards keep it in their `.meta` file, so the index can be recomputed: sample
counts from the headers, sizes and digests from the bytes (compressed shards are decompressed to get
the raw size and digests). Each shard is fully validated on the way; bad ones are either an error or,
with `skip_bad=True`, left out and reported.

A dataset whose write was interrupted (a `convert` killed mid-way) also has no index.json, but its shard
files are only part of the data: rebuilding an index from them would commit a partial dataset that looks
complete. Repair refuses it (`InterruptedWrite`, see interrupted.py) unless the caller asks for a partial
index with `allow_partial=True`, and then commits only the write's complete prefix.
"""

from __future__ import annotations

import io
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tessera.shards.compression import FAMILIES, parse_compression
from tessera.shards.errors import DatasetExists, ShardFormatError
from tessera.shards.hashing import digest_parts
from tessera.shards.index import INDEX_BASENAME, DatasetIndex, FileInfo, ShardEntry
from tessera.shards.interrupted import Interrupted, InterruptedWrite, interrupted_write
from tessera.shards.reader import ShardReader, parse_config
from tessera.storage import Store
from tessera.storage.local import write_atomic as atomic_write

_FORMATS = ("mds", "json", "csv", "tsv", "xsv")
_SHARD_FILE = re.compile(
    r"^(?P<raw>(?:.*/)?shard\.(?P<number>\d+)\.(?P<format>" + "|".join(_FORMATS) + r"))"
    r"(?P<meta>\.meta)?(?:\.(?P<family>" + "|".join(FAMILIES) + r"))?$"
)
MAX_SHARD_BYTES = 1 << 32  # sample offsets are u32: no shard file is larger, whatever it inflates to


@dataclass
class RepairReport:
    """The rebuilt index, and the shard files left out (with the reason) when `skip_bad=True`."""

    index: DatasetIndex
    skipped: list[tuple[str, str]] = field(default_factory=list)
    written: bool = False
    interrupted: Interrupted | None = None  # set when allow_partial rebuilt after an interrupted write


@dataclass
class _Files:
    """The stored files of one shard, keyed by kind: raw/zip data, raw/zip meta."""

    number: int
    format: str
    keys: dict[str, str] = field(default_factory=dict)


def _group(store: Store) -> list[tuple[str, _Files]]:
    shards: dict[str, _Files] = {}
    for info in store.list():
        match = _SHARD_FILE.match(info.key)
        if not match:
            continue
        files = shards.setdefault(match["raw"], _Files(int(match["number"]), match["format"]))
        kind = ("zip" if match["family"] else "raw") + ("_meta" if match["meta"] else "_data")
        files.keys[kind] = info.key
    return sorted(shards.items(), key=lambda item: (item[0].rpartition("/")[0], item[1].number, item[0]))


def _blobs(store: Store, files: _Files, kind: str, label: str) -> tuple[bytes, bytes | None]:
    """(raw bytes, compressed bytes or None) of the data or meta file of a shard.

    The raw bytes come from the uncompressed file when one is stored (a reader may have left it next to
    the compressed one), else from decompressing the compressed file.
    """
    raw_key, zip_key = files.keys.get(f"raw_{kind}"), files.keys.get(f"zip_{kind}")
    compressed = store.get(zip_key) if zip_key else None
    if raw_key:
        return store.get(raw_key), compressed
    if zip_key is None or compressed is None:
        raise ShardFormatError(label, f"no {kind} file found")
    codec = parse_compression(zip_key.rpartition(".")[2])
    try:  # streamed with a cap: a decompression bomb is an error, not an out-of-memory kill
        return b"".join(codec.inflate(io.BytesIO(compressed), MAX_SHARD_BYTES)), compressed  # type: ignore[union-attr]
    except Exception as err:  # each codec library raises its own type (some with no message)
        reason = str(err) or type(err).__name__
        raise ShardFormatError(store.url_for(zip_key), f"cannot decompress: {reason}") from None


def _file_info(files: _Files, kind: str, algos: list[str], raw: bytes,
               compressed: bytes | None) -> tuple[FileInfo, FileInfo | None]:
    """(raw info, compressed info) for the data or meta file of a shard, digests recomputed."""
    zip_key = files.keys.get(f"zip_{kind}")
    raw_key = files.keys.get(f"raw_{kind}") or (zip_key or "").rpartition(".")[0]
    raw_info = FileInfo(raw_key, len(raw), digest_parts(algos, [raw]))
    if compressed is None or zip_key is None:
        return raw_info, None
    return raw_info, FileInfo(zip_key, len(compressed), digest_parts(algos, [compressed]))


def _config(blob: bytes, fmt: str, label: str) -> dict:
    """The writer config embedded in an MDS shard, or in the .meta file of a text shard."""
    if len(blob) < 8:
        raise ShardFormatError(label, "file is too short to hold a header")
    count = int.from_bytes(blob[:4], "little")
    end = int.from_bytes(blob[4:8], "little") if fmt == "mds" else len(blob)
    return parse_config(blob, 8 + 4 * count, end, label, None)


def _rebuild_entry(store: Store, raw_name: str, files: _Files, scratch: Path) -> ShardEntry:
    label = store.url_for(raw_name)
    raw, compressed = _blobs(store, files, "data", label)
    meta, zmeta = _blobs(store, files, "meta", label) if files.format != "mds" else (raw, None)
    config = _config(meta, files.format, label)
    compression = config.get("compression")
    if compression and compressed is None:
        raise ShardFormatError(label, f"config says {compression} but the compressed file is missing")
    if not compression:
        compressed = zmeta = None  # a stray compressed copy is not part of an uncompressed dataset
    algos = config.get("hashes") or []
    data_info, zip_info = _file_info(files, "data", algos, raw, compressed)
    obj = {**config, "raw_data": data_info.to_json(), "zip_data": zip_info.to_json() if zip_info else None}
    if files.format == "mds":
        path = scratch / "shard.mds"
        atomic_write(path, raw)
        reader = ShardReader(path, label=label)  # validates header, offsets and embedded config
        obj["samples"] = reader.num_samples
        reader.close()
        return ShardEntry.from_json(obj, label)
    meta_info, zmeta_info = _file_info(files, "meta", algos, meta, zmeta)
    obj.update(samples=int.from_bytes(meta[:4], "little"), raw_meta=meta_info.to_json(),
               zip_meta=zmeta_info.to_json() if zmeta_info else None)
    return ShardEntry.from_json(obj, label)


def repair_index(url: str | Path | Store, split: str | None = None, *, overwrite: bool = False,
                 skip_bad: bool = False, dry_run: bool = False, allow_partial: bool = False) -> RepairReport:
    """Rebuild index.json of the dataset at `url` from its shard files and commit it (atomically).

    Args:
        overwrite: replace an existing index.json (otherwise DatasetExists).
        skip_bad: leave out shards that fail validation (listed in the report) instead of raising.
        dry_run: compute the index without writing it.
        allow_partial: rebuild even though a write was interrupted (otherwise InterruptedWrite), from
            the write's complete prefix only (the rest is listed as skipped); the journal is kept, so
            `mode="resume"` can still finish the write and replace the partial index.
    """
    from tessera.shards.dataset import open_dataset_store

    store = open_dataset_store(url, split)
    groups = _group(store)
    interrupted = interrupted_write(store, [name for name, _ in groups])
    if interrupted is not None and not allow_partial:
        raise InterruptedWrite(store.url, interrupted)
    if not overwrite and not dry_run and store.exists(INDEX_BASENAME):
        raise DatasetExists(f"{store.url_for(INDEX_BASENAME)} exists; pass overwrite=True to rebuild it anyway")
    report = RepairReport(DatasetIndex(), interrupted=interrupted)
    if interrupted is not None:
        keep, left = interrupted.complete_prefix([name for name, _ in groups])
        kept = set(keep)
        groups = [(name, files) for name, files in groups if name in kept]
        report.skipped += [(store.url_for(name), why) for name, why in left]
    with tempfile.TemporaryDirectory(prefix="tessera-repair-") as scratch:
        for raw_name, files in groups:
            try:
                report.index.shards.append(_rebuild_entry(store, raw_name, files, Path(scratch)))
            except ShardFormatError as err:
                if not skip_bad:
                    raise
                report.skipped.append((store.url_for(raw_name), str(err)))
    if not dry_run:
        store.put(INDEX_BASENAME, report.index.to_json().encode("utf-8"))
        report.written = True
    return report
