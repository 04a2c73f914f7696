"""Whole per-device batches: gathering samples into stacked arrays, and handing them over from workers.

Fixed-size columns of a batch are gathered straight from the memory-mapped shards into one array per
column (row_addresses.py: one copy per column, whatever the number of shards). Through DataLoader
workers, torch's own path costs more than the gathering: it copies each tensor into a new shared-memory
segment and passes its file descriptor over a socket (about a millisecond a batch here), and every
DataLoader item pays its queue round trip. So when all selected columns are fixed-size, workers send
`BatchRefs` for a group of batches at once: each batch either names the shared slot the worker
gathered it into (slots.py; the training process hands it out without copying) or, when no slot was
free, the shard and row of each sample, which the training process gathers from its own mapping of the
cache files. Workers do everything else (plan, prefetch, download, pin) and have made sure every shard
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
import torch
from torch.utils.data import default_collate

from tessera.shards.encodings import FixedEncoding, lookup_encoding
from tessera.shards.index import ShardEntry
from tessera.shards.reader import ShardReader
from tessera.stream.row_addresses import RowAddresses
from tessera.stream.slots import Layout, SlotRing

# Batches per DataLoader item when workers send BatchRefs: torch's per-item cost (as much as a batch's
# gather) is then paid once per 16 batches, and a group is still tiny (16 x 64 x 16 bytes).
REF_GROUP = 16


class OutputPool:
    """Batch output arrays, recycled once nothing outside the pool refers to them any more.

    A fresh 256 KB array per batch is, with glibc's allocator, fresh pages from the kernel whenever
    several batches are alive at once (a DataLoader item of 16, a consumer holding a few): 64 page
    faults and zeroing per batch, as much CPU as the copy itself (benchmarks/RESULTS.md, Streaming). So
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
    # Per batch, the shared slot (slots.py) the worker gathered it into and its layout, or None.
    slots: tuple[tuple[int, Layout] | None, ...] | None = None

    @classmethod
    def of(cls, batches: Sequence[tuple[np.ndarray, np.ndarray]], data: dict[int, dict[str, Any]] | None = None,
           slots: Sequence[tuple[int, Layout] | None] = ()) -> BatchRefs:
        ends = tuple(np.cumsum([len(s) for s, _ in batches]).tolist())
        return cls(np.concatenate([s for s, _ in batches]), np.concatenate([r for _, r in batches]), ends,
                   data or None, tuple(slots) if any(slots) else None)

    def batches(self) -> list[tuple[np.ndarray, np.ndarray]]:
        starts = (0, *self.ends[:-1])
        return [(self.shards[a:b], self.rows[a:b]) for a, b in zip(starts, self.ends, strict=True)]

    def items(self) -> list[tuple[np.ndarray, np.ndarray, dict[str, Any] | None, tuple[int, Layout] | None]]:
        """(shards, rows, the batch if the worker sent it gathered, its slot if it gathered it into one)."""
        data, slots = self.data or {}, self.slots or (None,) * len(self.ends)
        return [(s, r, data.get(i), slots[i]) for i, (s, r) in enumerate(self.batches())]


def gather_to_slot(ring: SlotRing | None, worker: int, reader: Callable[[int], ShardReader], shards: np.ndarray,
                   rows: np.ndarray, addresses: RowAddresses | None = None) -> tuple[int, Layout] | None:
    """In a worker: gather a batch into a free shared slot; (slot, layout), or None when there is no ring,
    no free slot or the columns are not all fixed-size (the batch then goes as plain BatchRefs)."""
    if ring is None or not len(shards):
        return None
    book = addresses if addresses is not None else RowAddresses()
    layout, held = book.batch_layout(reader, shards)  # opens the shards; `held` keeps their mappings
    if layout is None:
        return None
    slot = ring.fill(worker, layout, len(shards), lambda out: book.copy(shards, rows, out))
    del held  # the copy is done
    return (slot, layout) if slot >= 0 else None


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


def gather(reader: Callable[[int], ShardReader], shards: np.ndarray, rows: np.ndarray,
           out: dict[str, np.ndarray] | None = None, addresses: RowAddresses | None = None) -> dict[str, Any]:
    """One batch: fixed-size columns stacked into arrays (in batch order), others as lists.

    `reader(shard)` opens (or returns the open) reader of a shard. With `out` (arrays of the batch's
    layout, e.g. a shared slot: slots.py) fixed-size columns are written there and it is returned;
    otherwise into arrays of `OUTPUTS` (see OutputPool). Fixed-size columns are copied by one
    `torch.index_select` per column whatever the number of shards (row_addresses.py); pass the caller's
    `RowAddresses` (one per dataset and process) so shards already seen cost a lookup, not a table.
    Measured on 64 x 4 KB rows over 15 shards: ~45 us single-threaded (80-120 us before, shard by shard
    or row by row).
    """
    book = addresses if addresses is not None else RowAddresses()
    layout, held = book.batch_layout(reader, shards)  # `held` keeps the mappings copy reads (see there)
    if layout is None:
        return _gather_decoded(reader, list(dict.fromkeys(shards.tolist())), shards, rows)
    if out is None:
        out = {name: OUTPUTS.empty((len(shards), *shape), dtype) for name, dtype, shape in layout}
    book.copy(shards, rows, out)
    del held
    return out


def stack_samples(samples: list[Any]) -> Any:
    """A batch from whole samples (what a transform made of them): per column, tensors of one shape
    stacked into a tensor, numeric arrays or numbers of one shape into an array, anything else a list,
    as `gather` gives raw batches. Samples that are not dicts (a transform's tuples) go through torch's
    default collate."""
    if not samples or not isinstance(samples[0], dict):
        return default_collate(samples)
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        first = values[0]
        if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) and v.shape == first.shape
                                                   for v in values):
            out[key] = torch.stack(values)
            continue
        arrays = [np.asarray(v) for v in values] if isinstance(first, (np.ndarray, np.generic, int, float)) else []
        if arrays and arrays[0].dtype.kind in "biuf" and all(a.shape == arrays[0].shape for a in arrays):
            out[key] = np.stack(arrays)
        else:
            out[key] = values
    return out


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

