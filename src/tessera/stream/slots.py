"""Batch output slots shared with DataLoader workers, so the training process copies nothing.

With BatchRefs alone (gather.py), workers say where each sample is and the training process gathers
every batch itself: one copy per byte, on the process that also runs the training step, capped the
DataLoader path well below the main process's rate (benchmarks/RESULTS.md, Streaming). A `SlotRing` is one anonymous shared mapping
(`mmap(-1, n)`: MAP_SHARED|MAP_ANONYMOUS; nothing in /dev/shm, nothing to clean up after a crash)
created in the training process before the workers fork, so every worker sees the same pages. Each
worker owns a partition of fixed-size slots (one per-device batch each) and gathers batches straight
into free ones; the BatchRefs it sends then name the slot, and the training process hands out arrays
over the slot's memory without copying.

A slot is reused only when nothing refers to it any more. One byte per slot in the same mapping says
who owns it: FREE (a worker may fill it), FILLED (a worker wrote it, the item is on its way) or OUT
(handed to the consumer). Workers only move FREE -> FILLED in their own partition; the training process
only moves FILLED -> OUT when it hands a batch out, and OUT -> FREE once the reference counts of the
slot's arrays are back to what its own bookkeeping holds (any tensor or numpy view of a batch keeps
them up, as in `OutputPool`). A worker that finds no FREE slot (the consumer holds many batches) sends
plain BatchRefs for that batch and the training process gathers it as before: never a wait, never a
deadlock. Only for fork()ed workers (the mapping is inherited, not pickled) and fixed-size columns.
"""

from __future__ import annotations

import mmap
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

FREE, FILLED, OUT = 0, 1, 2
ALIGN = 64  # each column of a slot starts on a cache line
# Slots per worker: enough for the item the consumer is on, the worker's prefetched items and the one
# it is filling (4 DataLoader items of REF_GROUP = 16 batches); fewer when batches are large.
SLOTS_PER_WORKER = 64
MIN_SLOTS_PER_WORKER = 32
MAX_RING_BYTES = 256 << 20

# (column name, numpy dtype string, shape of one row) per column, in the batch's column order.
Layout = tuple[tuple[str, str, tuple[int, ...]], ...]


def layout_of(arrays: Sequence[tuple[str, np.ndarray]]) -> Layout:
    """The layout of a batch whose columns are these per-shard column views (rows along axis 0)."""
    return tuple((name, view.dtype.str, tuple(view.shape[1:])) for name, view in arrays)


def slot_bytes(layout: Layout, rows: int) -> int:
    """Bytes a batch of `rows` rows with this layout takes in a slot (columns aligned)."""
    return _offsets(layout, rows)[-1]


def _offsets(layout: Layout, rows: int) -> list[int]:
    out, at = [], 0
    for _, dtype, shape in layout:
        out.append(at)
        at += -(-rows * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize // ALIGN) * ALIGN
    return [*out, at]


@dataclass
class _Slot:
    """This process's arrays over one slot, and the reference counts they have when nobody else holds them."""

    layout: Layout
    rows: int
    flat: np.ndarray
    arrays: dict[str, np.ndarray]
    idle_refs: tuple[int, ...] = ()


def _refcounts(slot: _Slot) -> tuple[int, ...]:
    """Reference counts of a slot's buffer and arrays (numpy views of an array point at `flat`; tensors
    made by torch.from_numpy point at the array itself)."""
    return (sys.getrefcount(slot.flat), *(sys.getrefcount(a) for a in slot.arrays.values()))


class SlotRing:
    """Fixed-size batch slots in one shared anonymous mapping; see the module docstring."""

    def __init__(self, workers: int, per_worker: int, nbytes: int) -> None:
        self.workers, self.per_worker, self.nbytes = workers, per_worker, nbytes
        count = workers * per_worker
        self._data_start = -(-count // mmap.PAGESIZE) * mmap.PAGESIZE
        self._mm = mmap.mmap(-1, self._data_start + count * nbytes)  # anonymous, shared with fork()ed children
        self.state = np.frombuffer(self._mm, np.uint8, count)
        self._slots: dict[int, _Slot] = {}  # this process's arrays per slot (each process builds its own)
        self._out: deque[int] = deque()  # training process: slots handed out, not yet free
        self.handed_out = 0  # batches handed out from slots (for TESSERA_STREAM_PROFILE)
        self._need: dict[tuple[Layout, int], int] = {}  # bytes a batch of this layout and size takes

    @classmethod
    def sized_for(cls, workers: int, batch_bytes: int) -> SlotRing | None:
        """A ring for `workers` workers and batches of at most `batch_bytes`, or None if too large."""
        per_worker = min(SLOTS_PER_WORKER, MAX_RING_BYTES // max(1, workers * batch_bytes))
        if workers < 1 or per_worker < MIN_SLOTS_PER_WORKER:
            return None
        return cls(workers, per_worker, batch_bytes)

    def _slot(self, index: int, layout: Layout, rows: int) -> _Slot:
        slot = self._slots.get(index)
        if slot is None or slot.layout != layout or slot.rows != rows:
            slot = self._slots[index] = self._build(index, layout, rows)
            slot.idle_refs = _refcounts(slot)  # measured with no other local name bound to its objects
        return slot

    def _build(self, index: int, layout: Layout, rows: int) -> _Slot:
        flat = np.frombuffer(self._mm, np.uint8, self.nbytes, self._data_start + index * self.nbytes)
        arrays = {}
        for (name, dtype, shape), at in zip(layout, _offsets(layout, rows), strict=False):
            size = rows * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            arrays[name] = flat[at:at + size].view(dtype).reshape(rows, *shape)
        return _Slot(layout, rows, flat, arrays)

    # --- in a worker ------------------------------------------------------------------------------------
    def fill(self, worker: int, layout: Layout, rows: int,
             gather_into: Callable[[dict[str, np.ndarray]], object]) -> int:
        """Gather one batch into a free slot of this worker's partition; its index, or -1 if none is free
        or the batch does not fit (the caller then sends plain BatchRefs)."""
        need = self._need.get((layout, rows))
        if need is None:  # (per batch otherwise: ~20 us of numpy calls)
            need = self._need[(layout, rows)] = slot_bytes(layout, rows)
        if need > self.nbytes:
            return -1
        lo = worker * self.per_worker
        free = np.flatnonzero(self.state[lo:lo + self.per_worker] == FREE)  # the lowest: its pages are warm
        if not len(free):
            return -1
        index = lo + int(free[0])
        self.state[index] = FILLED
        try:
            gather_into(self._slot(index, layout, rows).arrays)
        except BaseException:
            self.state[index] = FREE
            raise
        return index

    # --- in the training process ------------------------------------------------------------------------
    def hand_out(self, index: int, layout: Layout, rows: int) -> dict[str, np.ndarray]:
        """The batch a worker gathered into slot `index`, as arrays over the slot (no copy)."""
        slot = self._slot(index, layout, rows)
        self.state[index] = OUT
        self._out.append(index)
        self.handed_out += 1
        return dict(slot.arrays)

    def reclaim(self) -> None:
        """Free the handed-out slots nobody refers to any more (oldest first; stops at the first held one
        only for speed: a consumer holding one old batch does not pin the rest, the scan goes on)."""
        for _ in range(len(self._out)):
            index = self._out.popleft()
            slot = self._slots[index]
            if _refcounts(slot) == slot.idle_refs:
                self.state[index] = FREE
            else:
                self._out.append(index)

    def reset(self) -> None:
        """Before new workers start: slots filled by workers of an earlier iteration whose items were
        never handed out are free again (those handed out stay OUT until released)."""
        self.state[self.state == FILLED] = FREE
        self.reclaim()
