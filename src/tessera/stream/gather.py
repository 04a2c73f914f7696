"""Whole per-device batches: gathering samples into stacked arrays, and handing them over from workers.

Fixed-size columns of a batch are gathered straight from the memory-mapped shards into one array per
column. Through DataLoader workers, moving those bytes costs more than gathering them: torch copies each
tensor into a new shared-memory segment and passes its file descriptor over a socket (about a
millisecond a batch here, 0.15 GB/s), and every DataLoader item pays its queue round trip. So when all
selected columns are fixed-size, workers send `BatchRefs` instead: the shard and row of each sample, a
few bytes per sample, for a group of batches at once. The training process gathers the rows from its
own mapping of the same cache files: one copy from the page cache, no shared memory, no descriptors.
Workers still do everything else (plan, prefetch, download, pin), and they have made sure every shard
a group names is present before sending it.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessera.shards.encodings import FixedEncoding, lookup_encoding
from tessera.shards.index import ShardEntry
from tessera.shards.reader import ShardReader

# Batches per DataLoader item when workers send BatchRefs: torch's per-item cost (~0.3-0.5 ms on two
# loaded cores) is then paid once per 16 batches, and a group is still tiny (16 x 64 x 16 bytes).
REF_GROUP = 16


class OutputPool:
    """Batch output arrays, recycled once nothing outside the pool refers to them any more.

    A fresh 256 KB array per batch is, with glibc's allocator, fresh pages from the kernel whenever
    several batches are alive at once (a DataLoader item of 16, a consumer holding a few): 64 page
    faults and zeroing per batch, measured at ~60 us of CPU per batch, as much as the copy itself. So
    gather writes into arrays of this pool, handed out as they are (torch.from_numpy keeps a reference),
    and an array is reused only when its reference count shows that the pool alone holds it: a batch the
    caller still holds (or any tensor or view of it) is never overwritten. At most `max_bytes` are
    pooled per process; beyond, arrays are plain allocations.
    """

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes, self.pooled = max_bytes, 0
        self._arrays: dict[tuple[tuple[int, ...], str], deque[np.ndarray]] = {}
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        key = (shape, np.dtype(dtype).str)
        with self._lock:
            ring = self._arrays.setdefault(key, deque())
            for _ in range(len(ring)):  # oldest first: the one most likely released by now
                array = ring[0]
                ring.rotate(-1)
                if sys.getrefcount(array) <= 3:  # the ring, `array` and getrefcount's argument
                    return array
            array = np.empty(shape, dtype)
            if self.pooled + array.nbytes <= self.max_bytes:
                ring.append(array)
                self.pooled += array.nbytes
            return array


OUTPUTS = OutputPool()


@dataclass(frozen=True)
class BatchRefs:
    """Consecutive per-device batches named by (global shard id, row in shard) per sample."""

    shards: np.ndarray  # int64, all samples of all batches, in order
    rows: np.ndarray  # int64, same length
    ends: tuple[int, ...]  # end offset of each batch in `shards` / `rows`
    # Batches the worker gathered itself (their index in the group -> the batch): those with a shard not yet
    # in the cache, whose rows came by ranged reads (ranged.py) and cannot be read from the cache files.
    data: dict[int, dict[str, Any]] | None = None

    @classmethod
    def of(cls, batches: Sequence[tuple[np.ndarray, np.ndarray]],
           data: dict[int, dict[str, Any]] | None = None) -> BatchRefs:
        ends = tuple(np.cumsum([len(s) for s, _ in batches]).tolist())
        return cls(np.concatenate([s for s, _ in batches]), np.concatenate([r for _, r in batches]), ends,
                   data or None)

    def batches(self) -> list[tuple[np.ndarray, np.ndarray]]:
        starts = (0, *self.ends[:-1])
        return [(self.shards[a:b], self.rows[a:b]) for a, b in zip(starts, self.ends, strict=True)]

    def items(self) -> list[tuple[np.ndarray, np.ndarray, dict[str, Any] | None]]:
        """(shards, rows, the batch if the worker sent it gathered, else None) per batch."""
        data = self.data or {}
        return [(s, r, data.get(i)) for i, (s, r) in enumerate(self.batches())]


def all_fixed_size(entries: Sequence[ShardEntry], columns: Sequence[str] | None) -> bool:
    """Whether every selected column of these shards is fixed-size numeric (then batches stack)."""
    for entry in entries:
        for name, enc_name, size in zip(entry.column_names, entry.column_encodings, entry.column_sizes,
                                        strict=True):
            if columns is not None and name not in columns:
                continue
            if size is None or not isinstance(lookup_encoding(enc_name), FixedEncoding):
                return False
    return True


def gather(reader: Callable[[int], ShardReader], shards: np.ndarray, rows: np.ndarray) -> dict[str, Any]:
    """One batch: fixed-size columns stacked into arrays (in batch order), others as lists.

    `reader(shard)` opens (or returns the open) reader of a shard. Shards whose columns are all
    fixed-size are read through their cached strided views (no per-call decoding set-up). This runs
    once per batch (~8k batches/s at 2 GB/s of 256 KB batches), so the Python around the copies is kept
    to a few operations per shard: a batch from one shard is one fancy-index copy; a batch over a few
    shards is sorted by shard once (stable argsort) and each shard's rows are copied with one gather and
    one scatter into a preallocated output; a batch spread over many shards (about one row each, e.g.
    many lanes) stacks row views instead, since per-shard numpy calls would then cost more than per-row
    ones. Outputs of several shards come from `OUTPUTS` (see OutputPool). Measured here on 64 x 4 KB
    rows, warm mappings, the caller holding 4 batches: 2 shards 68 us (67 before), 16 shards 102 us
    (135 before); the copies alone are ~30-40 us.
    """
    order = shards.argsort(kind="stable")
    by_shard = shards[order]
    if len(shards) and by_shard[0] == by_shard[-1]:  # one shard: one copy per column
        views = _column_views(reader(int(by_shard[0])))
        if views is None:
            return _gather_decoded(reader, [int(by_shard[0])], shards, rows)
        return {name: view[rows] for name, view in views}
    cuts = [0, *(np.flatnonzero(by_shard[1:] != by_shard[:-1]) + 1).tolist(), len(shards)]
    uniq = by_shard[cuts[:-1]].tolist() if len(shards) else []
    views = [_column_views(reader(shard)) for shard in uniq]
    if not views or any(v is None for v in views):
        return _gather_decoded(reader, uniq, shards, rows)
    if len(uniq) * _ROWS_PER_SHARD_CALL > len(shards):  # many shards, few rows each: row by row
        pairs = list(zip(shards.tolist(), rows.tolist(), strict=True))
        stacked = {}
        for c, (name, _) in enumerate(views[0]):  # type: ignore[arg-type]
            by_id = {shard: cols[c][1] for shard, cols in zip(uniq, views, strict=True)}  # type: ignore[index]
            parts = [by_id[shard][r] for shard, r in pairs]
            stacked[name] = np.stack(parts, out=OUTPUTS.empty((len(parts), *np.shape(parts[0])), by_id[uniq[0]].dtype))
        return stacked
    out = {name: OUTPUTS.empty((len(shards), *v.shape[1:]), v.dtype) for name, v in views[0]}  # type: ignore[union-attr]
    for cols, a, b in zip(views, cuts[:-1], cuts[1:], strict=True):
        at = order[a:b]
        picked = rows[at]
        for name, view in cols:  # type: ignore[union-attr]
            out[name][at] = view[picked]
    return out


# Rows per shard below which copying row by row beats a gather + scatter per shard (measured: 64 rows
# over 16 shards, ~4 rows each, 79 us row by row vs 100 us per shard; over 2 shards 86 vs 59 us).
_ROWS_PER_SHARD_CALL = 8


def _column_views(reader: ShardReader) -> tuple[tuple[str, np.ndarray], ...] | None:
    """Zero-copy views of the selected columns, or None for shards with variable-size columns. Built once
    per reader and kept on it (it lives as long as the mapping): gather calls this for every batch."""
    views = reader.__dict__.get("_gather_views", False)
    if views is False:
        try:
            views = tuple((name, reader.column_view(name)) for name in reader.columns)
        except ValueError:  # not all columns fixed-size: no strided views of this shard
            views = None
        reader.__dict__["_gather_views"] = views
    return views


def _gather_decoded(reader: Callable[[int], ShardReader], uniq: list[int], shards: np.ndarray,
                    rows: np.ndarray) -> dict[str, Any]:
    """Shards with variable-size columns: decode each shard's part and place it in batch order."""
    if len(uniq) == 1:
        return reader(uniq[0]).get_batch(rows)
    out: dict[str, Any] = {}
    for shard in uniq:
        at = np.flatnonzero(shards == shard)
        part = reader(shard).get_batch(rows[at])
        for name, values in part.items():
            if isinstance(values, np.ndarray):
                if name not in out:
                    out[name] = np.empty((len(shards), *values.shape[1:]), dtype=values.dtype)
                out[name][at] = values
            else:
                slot = out.setdefault(name, [None] * len(shards))
                for r, v in zip(at.tolist(), values, strict=True):
                    slot[r] = v
    return out

