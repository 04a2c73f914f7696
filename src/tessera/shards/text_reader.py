"""Readers for the text members of the MDS family: JSON lines and CSV/TSV/XSV shards.

These shards are split in two files: the data (one text line per sample) and a `.meta` file holding
`u32 N`, `u32 offsets[N+1]` into the data file, and the writer's config JSON. The data file is mapped
once, like an MDS shard. CSV/TSV/XSV values are typed `str`, `int` or `float`; JSON samples are objects.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tessera.shards.compression import parse_compression
from tessera.shards.errors import CorruptShard, HashMismatch, MissingShard, TruncatedShard, UnknownEncoding
from tessera.shards.hashing import hash_hex
from tessera.shards.index import FileInfo, ShardEntry, shard_key
from tessera.shards.reader import ShardReader, map_file, parse_config, verify_digests
from tessera.storage import NotFound, Store
from tessera.storage.local import write_atomic

_TEXT_TYPES: dict[str, type] = {"str": str, "int": int, "float": float}
_SEPARATORS = {"csv": ",", "tsv": "\t"}
_PAIR = struct.Struct("<II")


class TextShardReader:
    """Random access to the samples of one JSON/CSV/TSV/XSV shard (data file + meta file).

    Same interface as `ShardReader` (`get`, `get_batch`, `columns`, `len`); every column is variable-size,
    so batches come back as lists.
    """

    def __init__(self, path: str | Path, meta: str | Path | bytes, entry: ShardEntry, *,
                 columns: Sequence[str] | None = None, verify_hashes: bool = False, label: str | None = None,
                 shard: int | None = None) -> None:
        self.path = Path(path)
        self.label, self.shard, self.entry = label or str(path), shard, entry
        self.meta_label = str(meta) if not isinstance(meta, bytes) else _sibling(self.label, entry)
        self._mm = map_file(self.path, self.label, shard, allow_empty=True)
        if not isinstance(meta, bytes):
            try:
                meta = Path(meta).read_bytes()
            except FileNotFoundError:
                raise MissingShard(self.meta_label, "meta file is missing", shard) from None
        if verify_hashes:
            verify_digests(self._mm, entry.raw_data, self.label, shard)
            if entry.raw_meta is not None:
                verify_digests(meta, entry.raw_meta, self.meta_label, shard)
        self.num_samples, self.offsets = self._read_meta(meta)
        self.config = parse_config(meta, 8 + 4 * self.num_samples, len(meta), self.meta_label, shard)
        if self.config.get("format") != entry.format or _config_columns(self.config) != dict(
                zip(entry.column_names, entry.column_encodings, strict=True)):
            raise CorruptShard(self.meta_label, "the config in the meta file names another format, other "
                               "columns or encodings than index.json", shard)
        wanted = entry.column_names if columns is None else list(columns)
        missing = set(wanted) - set(entry.column_names)
        if missing:
            raise KeyError(f"{self.label}: no columns {sorted(missing)}; the shard has {entry.column_names}")
        self.columns = [name for name in entry.column_names if name in set(wanted)]
        for name, encoding in zip(entry.column_names, entry.column_encodings, strict=True):
            if name in self.columns and encoding not in _TEXT_TYPES:
                raise UnknownEncoding(self.label, name, encoding, shard)
        self._types = [(name, _TEXT_TYPES.get(enc, str), name in self.columns)
                       for name, enc in zip(entry.column_names, entry.column_encodings, strict=True)]
        self._separator = entry.separator or _SEPARATORS.get(entry.format, ",")
        self._newline = entry.newline or "\n"

    def _read_meta(self, meta: bytes) -> tuple[int, np.ndarray]:
        label = self.meta_label
        if len(meta) < 8:
            raise TruncatedShard(label, f"meta file has {len(meta)} bytes, less than its header", self.shard)
        (count,) = struct.unpack_from("<I", meta, 0)
        if count != self.entry.samples:
            raise CorruptShard(label, f"holds {count} samples but index.json records {self.entry.samples}",
                               self.shard)
        if len(meta) < 8 + 4 * count:
            raise TruncatedShard(label, f"header says {count} samples but it has only {len(meta)} bytes", self.shard)
        offsets = np.frombuffer(meta, "<u4", count + 1, 4).astype(np.int64)
        size = len(self._mm)
        if np.any(np.diff(offsets) < 0) or offsets[0] > size:
            raise CorruptShard(label, "sample offsets are out of order", self.shard)
        if offsets[-1] > size:
            raise TruncatedShard(self.label, f"samples end at byte {offsets[-1]} but the file has {size}", self.shard)
        if offsets[-1] != size:
            raise CorruptShard(self.label, f"samples end at byte {offsets[-1]} but the file has {size}", self.shard)
        return count, offsets

    def __len__(self) -> int:
        return self.num_samples

    def raw_sample(self, index: int) -> bytes:
        """The stored text of one sample, newline included."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"{self.label}: sample {index} out of range [0, {self.num_samples})")
        begin, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return self._mm[begin:end]

    def get(self, index: int) -> dict[str, Any]:
        """Decode one sample into {column: value} for the selected columns."""
        data = self.raw_sample(index)
        try:
            text = data.decode("utf-8")
            if self.entry.format == "json":
                obj = json.loads(text)
                return {name: obj[name] for name in self.columns}
            parts = text.removesuffix(self._newline).split(self._separator)
            if len(parts) != len(self._types):
                raise ValueError(f"{len(parts)} fields for {len(self._types)} columns")
            return {name: kind(part) for (name, kind, selected), part in zip(self._types, parts, strict=True) if selected}
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptShard(self.label, f"sample {index} cannot be decoded: {err}", self.shard) from None

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.get(index)

    def get_batch(self, indices: Sequence[int] | np.ndarray | slice) -> dict[str, list[Any]]:
        """Decode many samples: {column: list of values}."""
        if isinstance(indices, slice):
            indices = range(*indices.indices(self.num_samples))
        samples = [self.get(int(i)) for i in indices]
        return {name: [sample[name] for sample in samples] for name in self.columns}

    def column_view(self, name: str) -> np.ndarray:
        """Text columns are variable-size: never a strided view (batches take the decoded path)."""
        raise ValueError(f"{self.label}: column {name!r} of a {self.entry.format} shard is not fixed-size")

    def close(self) -> None:
        self._mm = None  # type: ignore[assignment]


def read_meta(entry: ShardEntry, root: Path, remote: Store | None, label: str, shard: int | None,
              check: Collection[str] = ()) -> bytes:
    """The raw `.meta` bytes of a text shard whose data file a stream reads from `root`.

    Taken from `root` (the raw file, else the compressed one), else fetched from `remote` and kept under
    `root` atomically for the next open. Its size, and the digests of the algorithms in `check`
    (`validate_hash`), are checked against index.json: the offsets in it decide which bytes are served.
    """
    raw, zipped = entry.raw_meta, entry.zip_meta
    if raw is None:
        raise CorruptShard(label, f"{entry.format} shard entry names no meta file", shard)
    path = root / shard_key(raw.basename)
    if _size_of(path) == raw.bytes:
        return _checked(path.read_bytes(), raw, check, str(path), shard)
    stored = zipped or raw
    local = root / shard_key(stored.basename)
    if local.exists():
        blob = local.read_bytes()
    elif remote is not None:
        try:
            blob = remote.get(shard_key(stored.basename))
        except NotFound:
            raise MissingShard(remote.url_for(stored.basename), "meta file is missing", shard) from None
    else:
        raise MissingShard(str(path), "meta file is missing and there is no remote to fetch it from", shard)
    where = remote.url_for(stored.basename) if remote is not None and not local.exists() else str(local)
    blob = _checked(blob, stored, check, where, shard)
    if zipped is not None:
        codec = parse_compression(entry.compression)
        try:
            blob = b"".join(codec.inflate(io.BytesIO(blob), raw.bytes)) if codec else blob  # capped: no bomb
        except Exception as err:  # every codec library has its own error type
            raise CorruptShard(where, f"cannot decompress ({entry.compression}): {err}", shard) from None
        blob = _checked(blob, raw, check, f"{where} (decompressed)", shard)
    if remote is not None:
        write_atomic(path, blob)
    return blob


def _checked(data: bytes, info: FileInfo, check: Collection[str], label: str, shard: int | None) -> bytes:
    if len(data) != info.bytes:
        kind = TruncatedShard if len(data) < info.bytes else CorruptShard
        raise kind(label, f"meta file has {len(data)} bytes but index.json records {info.bytes}", shard)
    for algo in check:
        want = info.hashes.get(algo)
        if want is not None and hash_hex(algo, data) != want.lower():
            raise HashMismatch(label, f"{algo} digest differs from index.json's {want}", shard)
    return data


def _sibling(label: str, entry: ShardEntry) -> str:
    """How errors name the meta file of the data file named `label`."""
    data, meta = entry.raw_data.basename, entry.raw_meta.basename if entry.raw_meta else "?"
    return label[: -len(data)] + meta if label.endswith(data) else f"{label} (meta)"


def _config_columns(config: dict[str, Any]) -> Any:
    """{column: encoding} as a meta file's config records them."""
    if config.get("format") == "json":
        return config.get("columns")
    return dict(zip(config.get("column_names") or [], config.get("column_encodings") or [], strict=False))


def _size_of(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def open_shard_reader(path: Path, entry: ShardEntry, root: Path, remote: Store | None, *,
                      columns: Sequence[str] | None, allow_unsafe_types: bool, label: str, shard: int,
                      check: Collection[str] = ()) -> ShardReader | TextShardReader:
    """The reader of a stream's shard by its format: `ShardReader` for MDS, `TextShardReader` (with its
    meta file from `read_meta`) for JSON/CSV/TSV/XSV. `path` is the raw data file, already local."""
    if entry.format == "mds":
        return ShardReader(path, entry, columns=columns, allow_unsafe_types=allow_unsafe_types, label=label,
                           shard=shard)
    meta = read_meta(entry, root, remote, label, shard, check)
    return TextShardReader(path, meta, entry, columns=columns, label=label, shard=shard)
