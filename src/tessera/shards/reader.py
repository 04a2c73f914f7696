"""`ShardReader`: random access into one uncompressed MDS shard on local disk.

The file is memory-mapped once and its structure checked once (header, offsets in range and ordered,
`off[N] == file size`, size and optional digests against index.json); after that a sample costs one
`struct.unpack_from` for its offsets and one for its size header, and fixed-size columns decode as
numpy views of the mapping. A batch never builds per-sample dicts: fixed-size columns come back
stacked, as a zero-copy strided view when every sample has the same layout (all columns fixed), or with
one numpy gather otherwise.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tessera.shards.encodings import Encoding, FixedEncoding, lookup_encoding
from tessera.shards.errors import (
    CorruptShard,
    HashMismatch,
    MissingShard,
    ShardFormatError,
    TruncatedShard,
    UnknownEncoding,
    UnsafeEncoding,
)
from tessera.shards.hashing import HASH_ALGORITHMS, Digests
from tessera.shards.index import FileInfo, ShardEntry

_PAIR = struct.Struct("<II")
Indices = Sequence[int] | np.ndarray | slice


@dataclass(frozen=True)
class ColumnPlan:
    """Where one column sits in a sample and how to decode it."""

    name: str
    encoding_name: str
    encoding: Encoding | None  # None: unknown encoding (an error only if the column is decoded)
    size: int | None  # fixed byte size, None when the sample header gives it
    slot: int  # index into the sample's size header for variable columns, -1 for fixed ones
    selected: bool


def map_file(path: Path, label: str, shard: int | None, allow_empty: bool = False) -> mmap.mmap | bytes:
    """Read-only mapping of a whole file; a missing (or, unless allowed, empty) file is a typed error.

    An empty file cannot be mapped, so it comes back as b"" when allowed (text shards of 0 samples).
    """
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                if allow_empty:
                    return b""
                raise TruncatedShard(label, "file is empty", shard)
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise MissingShard(label, "shard file is missing", shard) from None


def verify_digests(data: Any, info: FileInfo, label: str, shard: int | None,
                   only: Collection[str] | None = None) -> None:
    """Check the digests index.json records for this file (all, or the algorithms in `only`);
    HashMismatch names the algorithm."""
    # In the index's (or the caller's) order, not a set's: which mismatch is reported first must not
    # depend on the interpreter's hash seed.
    wanted = list(dict.fromkeys(info.hashes if only is None else only))
    algos = [algo for algo in wanted if algo in HASH_ALGORITHMS and algo in info.hashes]
    unknown = sorted(set(wanted) - set(algos))
    if unknown:
        raise ShardFormatError(label, f"cannot verify hash algorithms {unknown}: unsupported, or not recorded "
                               f"in index.json (it records {sorted(info.hashes)})", shard)
    digests = Digests(algos)
    digests.update(data)
    for algo, got in digests.hexdigests().items():
        want = info.hashes[algo].lower()
        if got != want:
            raise HashMismatch(label, f"{algo} digest is {got} but index.json records {want}", shard)


def parse_config(data: Any, start: int, end: int, label: str, shard: int | None) -> dict[str, Any]:
    """The writer configuration JSON embedded in a shard between its header and first sample."""
    try:
        config = json.loads(bytes(data[start:end]))
    except (ValueError, RecursionError):  # RecursionError: nested past the interpreter's limit
        raise CorruptShard(label, "embedded config JSON is unreadable", shard) from None
    if not isinstance(config, dict):
        raise CorruptShard(label, "embedded config is not a JSON object", shard)
    return config


class ShardReader:
    """Random access to the samples of one MDS shard file.

    Args:
        path: the uncompressed shard on local disk.
        entry: its index.json entry; when omitted the columns come from the config embedded in the file.
        columns: names to decode (default all); others are skipped without decoding.
        allow_unsafe_types: decode `pkl` columns (pickle runs code from the data).
        verify_hashes: check the raw digests recorded in `entry` once, at open.
        label: how errors name the file (a URL for remote datasets); default the path.
        shard: the shard's position in index.json, for error messages.
    """

    def __init__(self, path: str | Path, entry: ShardEntry | None = None, *, columns: Sequence[str] | None = None,
                 allow_unsafe_types: bool = False, verify_hashes: bool = False, label: str | None = None,
                 shard: int | None = None) -> None:
        self.path = Path(path)
        self.label = label or str(path)
        self.shard = shard
        self._mm = map_file(self.path, self.label, shard)
        size = len(self._mm)
        if entry is not None and entry.raw_data.bytes != size:
            kind = TruncatedShard if size < entry.raw_data.bytes else CorruptShard
            raise kind(self.label, f"file has {size} bytes but index.json records {entry.raw_data.bytes}", shard)
        if verify_hashes and entry is not None:
            verify_digests(self._mm, entry.raw_data, self.label, shard)
        self.num_samples, self.offsets = self._read_offsets(size)
        config = parse_config(self._mm, 8 + 4 * self.num_samples, int(self.offsets[0]), self.label, shard)
        self.entry = entry if entry is not None else self._entry_from_config(config, size)
        if self.entry.samples != self.num_samples:
            raise CorruptShard(self.label, f"file holds {self.num_samples} samples but index.json records "
                               f"{self.entry.samples}", shard)
        self.config = config
        if entry is not None and (config.get("column_names"), config.get("column_encodings")) != (
            entry.column_names, entry.column_encodings):
            raise CorruptShard(self.label, "the config embedded in the shard names other columns or encodings "
                               "than index.json", shard)
        self._plan = self._make_plan(columns, allow_unsafe_types)
        self.columns = [col.name for col in self._plan if col.selected]
        self._nvar = sum(1 for col in self._plan if col.size is None)
        self._header = struct.Struct(f"<{self._nvar}I")
        self._uniform = self._nvar == 0  # every sample has the same layout: strided views apply
        self._fixed_total = sum(col.size or 0 for col in self._plan)
        if self._uniform and not np.all(np.diff(self.offsets) == self._fixed_total):
            raise CorruptShard(self.label, f"samples must all be {self._fixed_total} bytes (fixed-size "
                               "columns only)", shard)

    def _read_offsets(self, size: int) -> tuple[int, np.ndarray]:
        if size < 8:
            raise TruncatedShard(self.label, f"file has {size} bytes, less than a shard header", self.shard)
        (count,) = struct.unpack_from("<I", self._mm, 0)
        if size < 8 + 4 * count:
            raise TruncatedShard(self.label, f"header says {count} samples but the file has only {size} bytes "
                                 "(an interrupted copy?)", self.shard)
        offsets = np.frombuffer(self._mm, "<u4", count + 1, 4).astype(np.int64)
        if offsets[0] < 8 + 4 * count or np.any(np.diff(offsets) < 0) or offsets[-1] > size:
            if offsets[-1] > size and offsets[0] <= offsets[-1]:
                raise TruncatedShard(self.label, f"samples end at byte {offsets[-1]} but the file has only "
                                     f"{size} bytes (an interrupted copy?)", self.shard)
            raise CorruptShard(self.label, "sample offsets are out of range or out of order", self.shard)
        if offsets[-1] != size:
            raise CorruptShard(self.label, f"samples end at byte {offsets[-1]} but the file has {size} bytes",
                               self.shard)
        return count, offsets

    def _entry_from_config(self, config: dict[str, Any], size: int) -> ShardEntry:
        """An index entry rebuilt from the embedded config (for shards read without index.json)."""
        obj = {**config, "samples": self.num_samples, "raw_data": {"basename": self.path.name, "bytes": size,
               "hashes": {}}, "zip_data": None, "compression": None}
        return ShardEntry.from_json(obj, self.label, self.shard)

    def _make_plan(self, columns: Sequence[str] | None, allow_unsafe: bool) -> list[ColumnPlan]:
        entry, label = self.entry, self.label
        wanted = set(entry.column_names if columns is None else columns)
        missing = wanted - set(entry.column_names)
        if missing:
            raise KeyError(f"{label}: no columns {sorted(missing)}; the shard has {entry.column_names}")
        plan, slot = [], 0
        for name, enc_name, size in zip(entry.column_names, entry.column_encodings, entry.column_sizes, strict=True):
            encoding = lookup_encoding(enc_name)
            if encoding is not None and encoding.size != size:
                raise CorruptShard(label, f"column {name!r} ({enc_name}) has size {size} in index.json but the "
                                   f"encoding's size is {encoding.size}", self.shard)
            if name in wanted and encoding is not None and not encoding.safe and not allow_unsafe:
                raise UnsafeEncoding(label, name, enc_name, self.shard)
            plan.append(ColumnPlan(name, enc_name, encoding, size, -1 if size is not None else slot, name in wanted))
            slot += size is None
        return plan

    def __len__(self) -> int:
        return self.num_samples

    def _span(self, index: int) -> tuple[int, int]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"{self.label}: sample {index} out of range [0, {self.num_samples})")
        return _PAIR.unpack_from(self._mm, 4 + 4 * index)

    def raw_sample(self, index: int) -> bytes:
        """The stored bytes of one sample (size header and payloads)."""
        begin, end = self._span(index)
        return self._mm[begin:end]

    def get(self, index: int) -> dict[str, Any]:
        """Decode one sample into {column: value} for the selected columns."""
        begin, end = self._span(index)
        mm = self._mm
        try:
            sizes = self._header.unpack_from(mm, begin) if self._nvar else ()
            position = begin + 4 * self._nvar
            sample = {}
            for col in self._plan:
                size = col.size if col.slot < 0 else sizes[col.slot]
                if col.selected:
                    if position + size > end:
                        raise CorruptShard(self.label, f"sample {index}: column {col.name!r} overruns the "
                                           "sample", self.shard)
                    if col.encoding is None:
                        raise UnknownEncoding(self.label, col.name, col.encoding_name, self.shard)
                    sample[col.name] = col.encoding.decode_at(mm, position, size)
                position += size
        except (ValueError, struct.error) as err:
            if isinstance(err, ShardFormatError):
                raise
            raise CorruptShard(self.label, f"sample {index} cannot be decoded: {err}", self.shard) from None
        if position != end:
            raise CorruptShard(self.label, f"sample {index}: column sizes do not add up to its {end - begin} "
                               "bytes", self.shard)
        return sample

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.get(index)

    def column_view(self, name: str) -> np.ndarray:
        """All values of a fixed-size column as one read-only strided view of the mapping (no copy).

        Only for shards whose columns are all fixed-size (every sample has the same layout). Built once
        per column and kept: batch reads call this for every batch.
        """
        views = self.__dict__.setdefault("_views", {})
        view = views.get(name)
        if view is None:
            view = views[name] = self._make_column_view(name)
        return view

    def _make_column_view(self, name: str) -> np.ndarray:
        col = self._fixed_column(name)
        if not self._uniform:
            raise ValueError(f"{self.label}: column_view needs a shard whose columns are all fixed-size")
        position = int(self.offsets[0]) + sum(c.size or 0 for c in self._plan[: self._plan.index(col)])
        enc: FixedEncoding = col.encoding  # type: ignore[assignment]
        inner = tuple(int(s) * enc.dtype.itemsize for s in np.cumprod((enc.shape + (1,))[:0:-1])[::-1])
        shape = (self.num_samples, *enc.shape)
        if self.num_samples == 0:
            return np.empty(shape, enc.dtype)
        return np.ndarray(shape, enc.dtype, self._mm, position, (self._fixed_total, *inner))

    def _fixed_column(self, name: str) -> ColumnPlan:
        for col in self._plan:
            if col.name == name:
                if col.encoding is None:
                    raise UnknownEncoding(self.label, col.name, col.encoding_name, self.shard)
                if not isinstance(col.encoding, FixedEncoding) or col.size is None:
                    raise ValueError(f"{self.label}: column {name!r} ({col.encoding_name}) is not fixed-size")
                return col
        raise KeyError(f"{self.label}: no column {name!r}")

    def get_batch(self, indices: Indices) -> dict[str, Any]:
        """Decode many samples at once: {column: stacked array (fixed-size) or list (variable)}.

        A slice over an all-fixed-size shard returns zero-copy views; other index sets cost one gather.
        """
        if isinstance(indices, slice):
            if self._uniform:
                return {col.name: self.column_view(col.name)[indices] for col in self._plan if col.selected}
            indices = range(*indices.indices(self.num_samples))
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_samples):
            raise IndexError(f"{self.label}: sample indices out of range [0, {self.num_samples})")
        if self._uniform:
            return {col.name: self.column_view(col.name)[idx] for col in self._plan if col.selected}
        return self._gather(idx)

    def _gather(self, idx: np.ndarray) -> dict[str, Any]:
        """Batch decode for shards with variable-size columns: positions computed with numpy."""
        u8 = np.frombuffer(self._mm, np.uint8)
        starts, ends = self.offsets[idx], self.offsets[idx + 1]
        header_bytes = 4 * self._nvar
        if np.any(ends - starts < header_bytes):
            raise CorruptShard(self.label, "a sample is shorter than its size header", self.shard)
        rows = np.lib.stride_tricks.sliding_window_view(u8, header_bytes)[starts] if len(u8) >= header_bytes else None
        sizes = rows.view("<u4").astype(np.int64) if rows is not None else np.zeros((len(idx), 0), np.int64)
        position = starts + header_bytes
        batch: dict[str, Any] = {}
        for col in self._plan:
            width = np.full(len(idx), col.size, np.int64) if col.size is not None else sizes[:, col.slot]
            if col.selected:
                if np.any(position + width > ends):
                    raise CorruptShard(self.label, f"column {col.name!r} overruns its sample", self.shard)
                batch[col.name] = self._decode_column(col, u8, position, width)
            position = position + width
        if not np.array_equal(position, ends):
            raise CorruptShard(self.label, "column sizes do not add up to the sample sizes", self.shard)
        return batch

    def _decode_column(self, col: ColumnPlan, u8: np.ndarray, position: np.ndarray, width: np.ndarray) -> Any:
        if col.encoding is None:
            raise UnknownEncoding(self.label, col.name, col.encoding_name, self.shard)
        enc = col.encoding
        if isinstance(enc, FixedEncoding) and col.size:
            rows = np.lib.stride_tricks.sliding_window_view(u8, col.size)[position]
            return rows.view(enc.dtype).reshape((len(position), *enc.shape))
        try:
            return [enc.decode_at(self._mm, p, w) for p, w in zip(position.tolist(), width.tolist(), strict=True)]
        except ValueError as err:
            raise CorruptShard(self.label, f"column {col.name!r} cannot be decoded: {err}", self.shard) from None

    def close(self) -> None:
        """Drop the mapping. Arrays still viewing it keep it alive until they are garbage."""
        self._mm = None  # type: ignore[assignment]
        self.__dict__.pop("_views", None)
