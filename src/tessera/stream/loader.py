"""`StreamingDataLoader`: a torch DataLoader that knows how far the global sample order has got.

It counts the batches it hands out; `state_dict()` turns that into samples consumed over all ranks,
which is all a resume needs. With `batch_path=True` the dataset yields whole per-device batches of
stacked arrays (no per-sample dicts, no collate loop): the fast path for fixed-size columns.

Object stores (S3, GCS, Azure) go through obstore, whose Rust (tokio) runtime does not survive fork():
once the dataset has fetched its index in this process, a fork()ed DataLoader worker that touches the
store hangs or crashes. With such a remote, workers therefore start from a forkserver (a clean process
that has imported tessera.stream once) unless you pass `multiprocessing_context` yourself.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate

from tessera.storage.local import LocalStore
from tessera.stream.dataset import StreamingDataset


def _needs_clean_workers(dataset: StreamingDataset) -> bool:
    """Whether the dataset reads from an object store (obstore: not fork-safe once used)."""
    return any(st.remote_store is not None and not isinstance(st.remote_store, LocalStore)
               for st in dataset.streams)


def _worker_context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tessera.stream"])  # workers start without importing torch again
    return ctx


class _BatchView(IterableDataset):
    """Wraps a StreamingDataset so that each item is one whole per-device batch."""

    def __init__(self, dataset: StreamingDataset) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.dataset.iter_batches()

    def __len__(self) -> int:
        """Per-device batches in one epoch, so trainers see the epoch end without running dry."""
        return len(self.dataset) // self.dataset.batch_size


def _tensor(value: np.ndarray) -> torch.Tensor:
    """A writable tensor from a (possibly read-only, mmap-backed) array. uint16 stays uint16 (half the
    bytes to move from workers); widen it where it is used (embedding lookups take `.long()`)."""
    return torch.from_numpy(np.array(value, copy=not value.flags.writeable))


def _to_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    """Collate for the batch path: stacked numeric arrays become tensors, the rest stays as is."""
    return {k: _tensor(v) if isinstance(v, np.ndarray) and v.dtype.kind in "biuf" else v
            for k, v in batch.items()}


def collate_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate per-sample dicts: numeric arrays and numpy scalars are stacked once (no read-only
    tensor warnings from mmap views), everything else goes through torch's default collate."""
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        first = values[0]
        if isinstance(first, (np.ndarray, np.generic)) and np.asarray(first).dtype.kind in "biuf":
            out[key] = _tensor(np.stack(values))
        else:
            out[key] = default_collate(values)
    return out


class StreamingDataLoader(DataLoader):
    """DataLoader over a StreamingDataset with `state_dict()` / `load_state_dict()` for mid-epoch resume."""

    def __init__(self, dataset: StreamingDataset, batch_size: int | None = None, *, batch_path: bool = False,
                 **kwargs: Any) -> None:
        if not isinstance(dataset, StreamingDataset):
            raise TypeError("StreamingDataLoader needs a StreamingDataset")
        batch_size = batch_size or dataset.batch_size
        if batch_size != dataset.batch_size:
            raise ValueError(f"DataLoader batch_size={batch_size} differs from the dataset's batch_size="
                             f"{dataset.batch_size}: the global order is planned in per-device batches of "
                             "the dataset's size, so they must match")
        if kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers=True is not supported: workers must see the epoch and the "
                             "resume position at the start of every epoch")
        if kwargs.get("num_workers", 0) > 0 and kwargs.get("multiprocessing_context") is None \
                and _needs_clean_workers(dataset):
            kwargs["multiprocessing_context"] = _worker_context()
        self.streaming_dataset = dataset
        self.batch_path = batch_path
        if batch_path:
            kwargs.setdefault("collate_fn", _to_tensors)
            super().__init__(_BatchView(dataset), batch_size=None, **kwargs)
        else:
            kwargs.setdefault("collate_fn", collate_samples)
            super().__init__(dataset, batch_size=batch_size, **kwargs)
        self._epoch = dataset._epoch
        self._batches_seen = 0

    def __iter__(self) -> Iterator[Any]:
        ds = self.streaming_dataset
        ds.set_epoch(self._epoch)
        self._batches_seen = 0
        for batch in super().__iter__():
            self._batches_seen += 1
            yield batch
        self._epoch += 1  # a finished epoch: the next iteration starts the next one from its start
        ds.set_epoch(self._epoch)
        ds._resume = None
        self._batches_seen = 0

    def state_dict(self) -> dict[str, Any]:
        """Where the global order stands (after the batches this loader has yielded)."""
        ds = self.streaming_dataset
        ds.set_epoch(self._epoch)
        consumed = self._batches_seen * ds.global_batch_size()
        return ds.state_dict(consumed, from_beginning=False)

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        self.streaming_dataset.load_state_dict(obj)
        self._epoch = self.streaming_dataset._epoch
        self._batches_seen = 0
