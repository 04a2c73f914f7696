"""`MDSDataset`: a random-access view over a whole MDS dataset, local or remote.

This is the simple map-style view (`len`, `ds[i]`, slices, index lists, iteration, batches); the
streaming layer (shuffling, elastic resumption, prefetch) builds on the same readers. Speed comes from
doing per-dataset work once: index parsed once, one reader (one mmap) per shard kept open, and the
sample-to-shard lookup is a bisect over cumulative sample counts (`np.searchsorted` for batches).
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tessera.shards.encodings import is_safe
from tessera.shards.errors import DatasetNotFound, UnsafeEncoding
from tessera.shards.fetch import ShardFetcher
from tessera.shards.index import INDEX_BASENAME, DatasetIndex
from tessera.shards.reader import ShardReader
from tessera.shards.text_reader import TextShardReader
from tessera.storage import NotFound, Store, open_store

Reader = ShardReader | TextShardReader


def open_dataset_store(url: str | os.PathLike[str] | Store, split: str | None = None) -> Store:
    """The store rooted at the dataset (the split's folder when a split is given).

    Anything that is not a path or URL is taken to be a store already (wrappers included).
    """
    store = open_store(url) if isinstance(url, str | os.PathLike) else url
    return store.child(split) if split else store


def read_index(store: Store) -> DatasetIndex:
    """Parse and validate the dataset's index.json; DatasetNotFound when there is none."""
    return DatasetIndex.from_json(index_bytes(store), store.url_for(INDEX_BASENAME))


def index_bytes(store: Store) -> bytes:
    """The dataset's index.json as stored; DatasetNotFound when there is none."""
    try:
        return store.get(INDEX_BASENAME)
    except NotFound:
        raise DatasetNotFound(f"{store.url_for(INDEX_BASENAME)}: no index.json (not an MDS dataset, or a write "
                              "that never committed; `tessera data repair` rebuilds a lost index from the "
                              "shards)") from None


class MDSDataset:
    """Samples of an MDS dataset by global index.

    Args:
        url: local path or storage URL of the dataset root (or a `Store`).
        split: optional sub-folder holding the split's index.json.
        columns: columns to decode (default all).
        allow_unsafe_types: decode `pkl` columns; otherwise opening a dataset that selects one fails.
        cache_dir: where remote or compressed shards are materialised (default under ~/.cache/tessera).
        verify_hashes: check each shard's recorded digests once, when it is first opened.
    """

    def __init__(self, url: str | Path | Store, split: str | None = None, columns: Sequence[str] | None = None,
                 allow_unsafe_types: bool = False, cache_dir: str | Path | None = None,
                 verify_hashes: bool = False) -> None:
        self._source, self._split = url, split
        self.store = open_dataset_store(url, split)
        self.index = read_index(self.store)
        self.columns = list(columns) if columns is not None else None
        self.allow_unsafe_types = allow_unsafe_types
        self.verify_hashes = verify_hashes
        self._fetcher = ShardFetcher(self.store, cache_dir, verify_hashes)
        self._check_columns()
        counts = [entry.samples for entry in self.index.shards]
        self._starts = [0, *np.cumsum(counts, dtype=np.int64).tolist()]
        self._cumulative = np.asarray(self._starts, dtype=np.int64)
        self._length = self._starts[-1]
        self._readers: list[Reader | None] = [None] * len(counts)
        self._lock = threading.Lock()

    def _check_columns(self) -> None:
        """Refuse unknown column names and pickle columns up front, before any shard is fetched."""
        label = self.store.url_for(INDEX_BASENAME)
        for shard, entry in enumerate(self.index.shards):
            missing = set(self.columns or ()) - set(entry.column_names)
            if missing:
                raise KeyError(f"{label}: shard {shard} has no columns {sorted(missing)} (it has {entry.column_names})")
            for name, encoding in zip(entry.column_names, entry.column_encodings, strict=True):
                selected = self.columns is None or name in self.columns
                if selected and entry.format == "mds" and not is_safe(encoding) and not self.allow_unsafe_types:
                    raise UnsafeEncoding(label, name, encoding, shard)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without open mappings, locks or store clients (DataLoader workers under spawn)."""
        state = self.__dict__.copy()
        for key in ("_readers", "_lock", "store", "_fetcher"):
            state.pop(key)
        state["_cache_dir"] = self._fetcher.cache_dir
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        cache_dir = state.pop("_cache_dir")
        self.__dict__.update(state)
        self.store = open_dataset_store(self._source, self._split)
        self._fetcher = ShardFetcher(self.store, cache_dir, self.verify_hashes)
        self._readers = [None] * self.num_shards
        self._lock = threading.Lock()

    @property
    def num_shards(self) -> int:
        return len(self.index.shards)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"MDSDataset({self.store.url!r}, samples={self._length}, shards={self.num_shards})"

    def reader(self, shard: int) -> Reader:
        """The (cached) reader of one shard, fetching the shard first if it is not local."""
        reader = self._readers[shard]
        if reader is not None:
            return reader
        with self._lock:
            reader = self._readers[shard]
            if reader is None:
                reader = self._open(shard)
                self._readers[shard] = reader
        return reader

    def _open(self, shard: int) -> Reader:
        entry = self.index.shards[shard]
        files = self._fetcher.files(entry, shard)
        label = self._fetcher.label(entry.raw_data.basename)
        if entry.format == "mds":
            return ShardReader(files.data, entry, columns=self.columns, allow_unsafe_types=self.allow_unsafe_types,
                               verify_hashes=self.verify_hashes, label=label, shard=shard)
        assert files.meta is not None
        return TextShardReader(files.data, files.meta, entry, columns=self.columns,
                               verify_hashes=self.verify_hashes, label=label, shard=shard)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, index within shard) of a global sample index (negative counts from the end)."""
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"sample {index} out of range for {self._length} samples")
        shard = bisect.bisect_right(self._starts, index) - 1
        return shard, index - self._starts[shard]

    def get(self, index: int) -> dict[str, Any]:
        """One decoded sample."""
        shard, local = self.locate(index)
        reader = self._readers[shard]
        if reader is None:
            reader = self.reader(shard)
        return reader.get(local)

    def __getitem__(self, key: int | slice | Sequence[int] | np.ndarray) -> Any:
        if isinstance(key, int | np.integer):
            return self.get(int(key))
        if isinstance(key, slice):
            return [self.get(i) for i in range(*key.indices(self._length))]
        return [self.get(int(i)) for i in key]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for shard in range(self.num_shards):
            reader = self.reader(shard)
            for local in range(len(reader)):
                yield reader.get(local)

    def get_batch(self, indices: Sequence[int] | np.ndarray | slice) -> dict[str, Any]:
        """Decode many samples: {column: stacked array (fixed-size columns) or list}, in `indices` order.

        Samples are grouped by shard so each shard is decoded with one batched call; a slice inside one
        shard of fixed-size columns returns zero-copy views.
        """
        if isinstance(indices, slice):
            start, stop, step = indices.indices(self._length)
            if step == 1 and stop > start:
                shard, local = self.locate(start)
                if stop <= self._starts[shard + 1]:
                    return self.reader(shard).get_batch(slice(local, local + stop - start))
            indices = range(start, stop, step)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        idx = np.where(idx < 0, idx + self._length, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self._length):
            raise IndexError(f"sample indices out of range for {self._length} samples")
        shards = np.searchsorted(self._cumulative, idx, side="right") - 1
        order = np.argsort(shards, kind="stable")
        bounds = np.flatnonzero(np.diff(shards[order])) + 1
        parts = []
        for group in np.split(order, bounds) if idx.size else []:
            shard = int(shards[group[0]])
            parts.append((group, self.reader(shard).get_batch(idx[group] - self._starts[shard])))
        return _assemble(parts, len(idx), self._column_names())

    def _column_names(self) -> list[str]:
        if self.columns is not None:
            return list(self.columns)
        return list(self.index.shards[0].column_names) if self.index.shards else []

    def close(self) -> None:
        """Drop every open reader (their mappings close once no returned array uses them)."""
        for reader in self._readers:
            if reader is not None:
                reader.close()
        self._readers = [None] * self.num_shards

    def __enter__(self) -> MDSDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _assemble(parts: list[tuple[np.ndarray, dict[str, Any]]], total: int, names: list[str]) -> dict[str, Any]:
    """Put per-shard batch pieces back in request order: arrays stay stacked, other values in lists."""
    if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(total)):
        return parts[0][1]
    batch: dict[str, Any] = {}
    for name in names:
        pieces = [values[name] for _, values in parts]
        if pieces and all(isinstance(piece, np.ndarray) for piece in pieces):
            stacked = np.concatenate(pieces)
            out = np.empty_like(stacked)
            out[np.concatenate([group for group, _ in parts])] = stacked
            batch[name] = out
            continue
        merged: list[Any] = [None] * total
        for (group, _), piece in zip(parts, pieces, strict=True):
            for position, value in zip(group.tolist(), piece, strict=True):
                merged[position] = value
        batch[name] = merged
    return batch
