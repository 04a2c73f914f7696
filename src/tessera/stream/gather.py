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


@dataclass(frozen=True)
class BatchRefs:
    """Consecutive per-device batches named by (global shard id, row in shard) per sample."""

    shards: np.ndarray  # int64, all samples of all batches, in order
    rows: np.ndarray  # int64, same length
    ends: tuple[int, ...]  # end offset of each batch in `shards` / `rows`

    @classmethod
    def of(cls, batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> BatchRefs:
        ends = tuple(np.cumsum([len(s) for s, _ in batches]).tolist())
        return cls(np.concatenate([s for s, _ in batches]), np.concatenate([r for _, r in batches]), ends)

    def batches(self) -> list[tuple[np.ndarray, np.ndarray]]:
        starts = (0, *self.ends[:-1])
        return [(self.shards[a:b], self.rows[a:b]) for a, b in zip(starts, self.ends, strict=True)]


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
    fixed-size are read through their cached strided views (no per-call decoding set-up); a batch from
    one shard is then a single gather, a batch over several is a gather and scatter per shard, which
    measured faster here than copying row by row into the batch.
    """
    uniq = np.unique(shards).tolist()
    views = [_column_views(reader(shard)) for shard in uniq]
    if any(v is None for v in views):
        return _gather_decoded(reader, uniq, shards, rows)
    if len(uniq) == 1:
        return {name: view[rows] for name, view in views[0].items()}  # type: ignore[union-attr]
    out = {name: np.empty((len(shards), *v.shape[1:]), dtype=v.dtype)
           for name, v in views[0].items()}  # type: ignore[union-attr]
    for shard, cols in zip(uniq, views, strict=True):
        at = shards == shard
        picked = rows[at]
        for name, dest in out.items():
            dest[at] = cols[name][picked]  # type: ignore[index]
    return out


def _column_views(reader: ShardReader) -> dict[str, np.ndarray] | None:
    """Zero-copy views of the selected columns, or None for shards with variable-size columns."""
    try:
        return {name: reader.column_view(name) for name in reader.columns}
    except ValueError:  # not all columns fixed-size: no strided views of this shard
        return None


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

