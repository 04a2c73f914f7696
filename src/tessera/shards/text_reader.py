"""Readers for the text members of the MDS family: JSON lines and CSV/TSV/XSV shards.

These shards are split in two files: the data (one text line per sample) and a `.meta` file holding
`u32 N`, `u32 offsets[N+1]` into the data file, and the writer's config JSON. The data file is mapped
once, like an MDS shard. CSV/TSV/XSV values are typed `str`, `int` or `float`; JSON samples are objects.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tessera.shards.errors import CorruptShard, MissingShard, TruncatedShard, UnknownEncoding
from tessera.shards.index import ShardEntry
from tessera.shards.reader import map_file, parse_config, verify_digests

_TEXT_TYPES: dict[str, type] = {"str": str, "int": int, "float": float}
_SEPARATORS = {"csv": ",", "tsv": "\t"}
_PAIR = struct.Struct("<II")


class TextShardReader:
    """Random access to the samples of one JSON/CSV/TSV/XSV shard (data file + meta file).

    Same interface as `ShardReader` (`get`, `get_batch`, `columns`, `len`); every column is variable-size,
    so batches come back as lists.
    """

    def __init__(self, path: str | Path, meta_path: str | Path, entry: ShardEntry, *,
                 columns: Sequence[str] | None = None, verify_hashes: bool = False, label: str | None = None,
                 shard: int | None = None) -> None:
        self.path, self.meta_path = Path(path), Path(meta_path)
        self.label, self.shard, self.entry = label or str(path), shard, entry
        self._mm = map_file(self.path, self.label, shard, allow_empty=True)
        try:
            meta = self.meta_path.read_bytes()
        except FileNotFoundError:
            raise MissingShard(str(meta_path), "meta file is missing", shard) from None
        if verify_hashes:
            verify_digests(self._mm, entry.raw_data, self.label, shard)
            if entry.raw_meta is not None:
                verify_digests(meta, entry.raw_meta, str(meta_path), shard)
        self.num_samples, self.offsets = self._read_meta(meta)
        self.config = parse_config(meta, 8 + 4 * self.num_samples, len(meta), str(meta_path), shard)
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
        label = str(self.meta_path)
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

    def close(self) -> None:
        self._mm = None  # type: ignore[assignment]
