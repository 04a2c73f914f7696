"""Where the rows of every open shard are in memory, so a batch over many shards is one copy per column.

A shuffled batch often holds a few rows of each of many shards (64 rows over 15 shards in the 1 GB
benchmark). Copying shard by shard (a gather and a scatter per shard) or row by row (a view per row,
then np.stack) cost 80-120 us per 64 x 4 KB batch, of which the copies are ~30. Here each row's byte
address is its shard's base address (per column) + row x the shard's row stride, computed for a whole
batch with numpy from arrays indexed by global shard id, and the rows are copied by one
`torch.index_select` per column from a uint8 view spanning every mapping seen, with a row stride of one
byte: row k of that view is the `row_bytes` bytes starting at address lo + k.

Only the rows of shards whose reader the caller holds are ever read: an entry is used only while it was
made from that very reader object (a weak reference, so the table keeps no mapping alive), and a reader's
column views keep its mapping even after `close()`. `batch_layout` therefore returns the batch's readers
and the caller keeps them until `copy` is done: a dataset under a cache limit keeps only a few readers
open and closes the least recently used one when it opens another, so a batch over more shards than that
would otherwise copy from mappings already released (a SIGSEGV on the first batch). Entries of
readers closed since are replaced the next time their shard is seen. The span may cover unmapped gaps
between mappings; nothing there is read.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tessera.shards.reader import ShardReader
from tessera.stream.slots import Layout, layout_of


@dataclass(frozen=True)
class RowTable:
    """One shard's rows: per selected column the address of row 0 and its bytes per row, the row stride
    (the shard's sample size) and the row count. Kept on the reader (its views hold the mapping)."""

    layout: Layout
    bases: tuple[int, ...]
    row_bytes: tuple[int, ...]
    stride: int
    rows: int


def row_table(reader: ShardReader) -> RowTable | None:
    """The row table of a reader whose columns are all fixed-size, else None; kept on the reader."""
    table = reader.__dict__.get("_row_table", False)
    if table is False:
        views = column_views(reader)
        table = None
        if views is not None:
            first = views[0][1] if views else np.empty(0)
            table = RowTable(layout_of(views), tuple(v.__array_interface__["data"][0] for _, v in views),
                             tuple(v.dtype.itemsize * int(np.prod(v.shape[1:], dtype=np.int64)) for _, v in views),
                             int(first.strides[0]) if first.ndim else 0, int(first.shape[0]) if first.ndim else 0)
        reader.__dict__["_row_table"] = table
    return table


def column_views(reader: ShardReader) -> tuple[tuple[str, np.ndarray], ...] | None:
    """Zero-copy views of the selected columns, or None for shards with variable-size columns. Built once
    per reader and kept on it (it lives as long as the mapping)."""
    views = reader.__dict__.get("_gather_views", False)
    if views is False:
        try:
            views = tuple((name, reader.column_view(name)) for name in reader.columns)
        except ValueError:  # not all columns fixed-size: no strided views of this shard
            views = None
        reader.__dict__["_gather_views"] = views
    return views


class _Span:
    """`n` bytes at address `addr`, as an array interface (numpy then wraps memory it does not own)."""

    def __init__(self, addr: int, n: int) -> None:
        self.__array_interface__ = {"data": (addr, False), "shape": (n,), "typestr": "|u1", "version": 3}


class RowAddresses:
    """Per reader process and dataset: row tables as arrays indexed by global shard id (see the module
    docstring). `see` each shard of a batch (with the reader just returned for it), then `copy`."""

    def __init__(self) -> None:
        # per shard, the reader its entry was made from (weakly: the open readers are `OpenShards`'s)
        self._made_from: list[weakref.ref[ShardReader] | None] = []
        self._layout_id = np.full(0, -1, np.int64)  # index into _layouts; -1: not all columns fixed-size
        self._stride = np.zeros(0, np.int64)
        self._base = np.zeros((0, 1), np.int64)  # (shard, column)
        self._layouts: list[tuple[Layout, tuple[int, ...]]] = []  # (layout, bytes per row of each column)
        self._lo, self._hi = -1, -1  # the span: every row of every shard seen lies in [lo, hi)
        self._views: dict[int, torch.Tensor] = {}  # bytes per row -> (hi - lo - n + 1, n) view, stride (1, 1)

    def see(self, shard: int, reader: ShardReader) -> int:
        """Record where `reader` (the open reader of `shard`) keeps its rows; its layout id, or -1 if its
        columns are not all fixed-size (the batch is then decoded instead)."""
        if shard < len(self._made_from):
            ref = self._made_from[shard]
            if ref is not None and ref() is reader:
                return int(self._layout_id[shard])
        self._set(shard, reader)
        return int(self._layout_id[shard])

    def batch_layout(self, reader: Callable[[int], ShardReader],
                     shards: np.ndarray) -> tuple[Layout | None, list[ShardReader]]:
        """`see` every shard of a batch (opening them through `reader`): the batch's layout (None if a
        shard has variable-size columns) and its readers, which the caller must keep referenced until
        `copy` has run (their views keep the mappings `copy` reads). ValueError if the shards' columns do
        not stack."""
        ids: dict[int, int] = {}
        held: list[ShardReader] = []
        for shard in dict.fromkeys(shards.tolist()):
            held.append(reader(shard))
            ids[shard] = self.see(shard, held[-1])
        kinds = set(ids.values())
        if -1 in kinds:
            return None, held
        if len(kinds) > 1:
            a, la = next(iter(ids.items()))
            b, lb = next((s, k) for s, k in ids.items() if k != la)
            raise ValueError(f"a batch mixes shards whose columns do not stack: shard {a} has "
                             f"{self._layouts[la][0]}, shard {b} has {self._layouts[lb][0]}")
        return self._layouts[kinds.pop()][0], held

    def _set(self, shard: int, reader: ShardReader) -> None:
        table = row_table(reader)
        if shard >= len(self._made_from):
            grow = max(shard + 1, 2 * len(self._made_from), 64)
            self._made_from += [None] * (grow - len(self._made_from))
            self._layout_id = np.concatenate([self._layout_id, np.full(grow - len(self._layout_id), -1, np.int64)])
            self._stride = np.concatenate([self._stride, np.zeros(grow - len(self._stride), np.int64)])
            self._base = np.concatenate([self._base, np.zeros((grow - len(self._base), self._base.shape[1]), np.int64)])
        self._made_from[shard] = weakref.ref(reader)
        self._layout_id[shard] = -1
        if table is None:
            return
        key = (table.layout, table.row_bytes)
        if key not in self._layouts:
            self._layouts.append(key)
        if len(table.bases) > self._base.shape[1]:
            wider = np.zeros((len(self._base), len(table.bases)), np.int64)
            wider[:, :self._base.shape[1]] = self._base
            self._base = wider
        self._layout_id[shard] = self._layouts.index(key)
        self._stride[shard] = table.stride
        self._base[shard, :len(table.bases)] = table.bases
        if table.rows and table.bases:
            lo = min(table.bases)
            hi = max(b + table.stride * (table.rows - 1) + n for b, n in zip(table.bases, table.row_bytes, strict=True))
            if self._lo < 0 or lo < self._lo or hi > self._hi:
                self._lo = lo if self._lo < 0 else min(lo, self._lo)
                self._hi = max(hi, self._hi)
                self._views.clear()

    def copy(self, shards: np.ndarray, rows: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """out[name][k] = column `name` of row rows[k] of shard shards[k], for every k (all seen)."""
        layout, row_bytes = self._layouts[int(self._layout_id[shards[0]])]
        starts = rows.astype(np.int64, copy=False) * self._stride[shards] - self._lo
        for c, (name, _, _) in enumerate(layout):
            if not row_bytes[c] or not len(shards):
                continue
            target = torch.from_numpy(out[name].reshape(len(shards), -1).view(np.uint8))
            torch.index_select(self._view(row_bytes[c]), 0, torch.from_numpy(self._base[shards, c] + starts),
                               out=target)

    def _view(self, row_bytes: int) -> torch.Tensor:
        view = self._views.get(row_bytes)
        if view is None:
            span = torch.from_numpy(np.asarray(_Span(self._lo, self._hi - self._lo)))
            view = self._views[row_bytes] = span.as_strided((span.numel() - row_bytes + 1, row_bytes), (1, 1))
        return view
