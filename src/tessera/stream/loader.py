"""`StreamingDataLoader`: a torch DataLoader that knows how far the global sample order has got.

It counts the batches it hands out; `state_dict()` turns that into samples consumed over all ranks,
which is all a resume needs. With `batch_path=True` the dataset yields whole per-device batches of
stacked arrays (no per-sample dicts, no collate loop): the fast path for fixed-size columns. With
workers and only fixed-size columns, workers send BatchRefs (where each sample is) in groups of
batches and this process gathers the rows from the cache files (gather.py): on the batch path, and on
the per-sample path when the default collate would only stack them anyway (same tensors).

Object stores (S3, GCS, Azure) go through obstore, whose Rust (tokio) runtime does not survive fork():
once this process has made an object-store request, a fork()ed DataLoader worker that makes another
hangs. The dataset therefore reads its index.json from a short-lived helper (forksafe.py) and the
runtime never starts here, so workers fork normally (fast: nothing to re-import). If something else
in the process has started it, workers come from a forkserver instead (a clean process that has
imported tessera.stream once; ~2 s the first time), unless you pass `multiprocessing_context`.

With `persistent_workers=True` the workers outlive an epoch, so the dataset copy each one holds would
keep the epoch and resume position of the first iteration. Before every iteration this process
therefore writes its dataset's resume state (`state_dict`) into a small shared buffer, and each worker
loads it at the start of its iteration: the same order as fresh workers, every epoch, after
`load_state_dict` and after an epoch broken off part-way alike.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info
from torch.utils.data._utils.pin_memory import pin_memory

from tessera.shards.encodings import lookup_encoding
from tessera.storage.fork_gate import fork_gate
from tessera.storage.local import LocalStore
from tessera.stream.dataset import StreamingDataset
from tessera.stream.forksafe import die_with_parent, fork_is_clean, limit_malloc_arenas
from tessera.stream.gather import OUTPUTS, REF_GROUP, all_fixed_size
from tessera.stream.slots import FILLED, FREE, SlotRing, slot_bytes


def _needs_clean_workers(dataset: StreamingDataset, gate_open: bool) -> bool:
    """Whether fork()ed workers could hang: the dataset reads from an object store and obstore's
    runtime already runs in this process (checked under the fork gate when workers start)."""
    remote = any(st.remote_store is not None and not isinstance(st.remote_store, LocalStore)
                 for st in dataset.streams)
    return remote and not fork_is_clean(gate_open)


def _worker_context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    # Workers start without importing torch again; the forkserver dies with this process (forkserver_init).
    ctx.set_forkserver_preload(["tessera.stream", "tessera.stream.forkserver_init"])
    return ctx


class _IterationState:
    """The resume state the next iteration starts from, shared with persistent workers.

    A shared-memory tensor: torch passes it to fork()ed, forkserver and spawned workers alike (by file
    descriptor, with nothing left in /dev/shm). Only the training process writes it, and only between
    iterations, before the DataLoader tells its workers to start the next one.
    """

    CAPACITY = 1 << 16

    def __init__(self) -> None:
        self._buf = torch.zeros(8 + self.CAPACITY, dtype=torch.uint8).share_memory_()

    def publish(self, dataset: StreamingDataset) -> None:
        blob = json.dumps(dataset.state_dict(0, from_beginning=False)).encode()
        if len(blob) > self.CAPACITY:
            raise ValueError(f"stream resume state of {len(blob)} bytes does not fit the {self.CAPACITY}-byte "
                             "buffer persistent workers read it from")
        view = self._buf.numpy()
        view[8:8 + len(blob)] = np.frombuffer(blob, np.uint8)
        view[:8] = np.frombuffer(np.uint64(len(blob)).tobytes(), np.uint8)

    def load_into(self, dataset: StreamingDataset) -> None:
        view = self._buf.numpy()
        size = int(view[:8].view(np.uint64)[0])
        dataset.load_state_dict(json.loads(view[8:8 + size].tobytes()))


def _start_worker_iteration(dataset: StreamingDataset, shared: _IterationState | None,
                            ring: SlotRing | None) -> None:
    """In a persistent worker, before each iteration: take up where the training process stands, and
    free the slots of its partition that a broken-off iteration filled (their items were dropped by
    the DataLoader and will never be handed out; nothing else of this worker's can be in flight yet)."""
    info = get_worker_info()
    if shared is None or info is None:
        return
    shared.load_into(dataset)
    if ring is not None:
        own = ring.state[info.id * ring.per_worker:(info.id + 1) * ring.per_worker]
        own[own == FILLED] = FREE


def _worker_start(user_init: Callable[[int], Any] | None, worker_id: int) -> None:
    """Every worker first ties its life to the training process's (forksafe.die_with_parent) and caps its
    malloc arenas (forksafe.limit_malloc_arenas), before its download threads start. It ignores SIGINT: a
    Ctrl-C at the terminal reaches every process of the foreground group, and the training process decides
    what it means (`tessera train` saves and stops, then ends its workers); a worker dead of it would fail
    that stop instead."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_malloc_arenas()
    # A worker's gathered batches are pickled to the training process (or gathered into shared slots), so
    # recycling output arrays buys it nothing and kept up to 64 MiB of them alive per worker.
    OUTPUTS.max_bytes = 0
    if user_init is not None:
        user_init(worker_id)


def _batch_rows(batch: Any) -> int:
    """Samples in a whole per-device batch (a mapping of columns, stacked or as lists)."""
    return len(next(iter(batch.values()))) if isinstance(batch, dict) and batch else len(batch)


class _BatchView(IterableDataset):
    """Wraps a StreamingDataset so that each item is a group of `group` whole per-device batches
    (a list of batches, or their BatchRefs when `refs`). `ring`, when set (fork()ed workers only), is
    the shared slot ring workers gather into (slots.py); `shared` is set with persistent workers."""

    def __init__(self, dataset: StreamingDataset, group: int, refs: bool, shared: _IterationState | None) -> None:
        self.dataset, self.group, self.refs, self.shared = dataset, group, refs, shared
        self.ring: SlotRing | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "ring": None}  # a mapping only fork() can share; spawned workers send refs

    def __iter__(self) -> Iterator[Any]:
        # A generator: a persistent worker loads the state at its first item, once the DataLoader has
        # closed (and so cleaned up after) the iteration this one replaces.
        info = get_worker_info()
        ring = self.ring if info is not None else None
        _start_worker_iteration(self.dataset, self.shared, ring)
        items = self.dataset.iter_batch_groups(self.group, self.refs, ring, info.id if info else 0)
        yield from items if self.refs or self.group == 1 else _regroup(items, self.group)

    def __len__(self) -> int:
        """Items in one epoch."""
        batches = math.ceil(len(self.dataset) / self.dataset.batch_size)  # the last may be partial
        return math.ceil(batches / self.group)


class _SampleView(IterableDataset):
    """The per-sample path with persistent workers: the dataset's own samples, after the worker has
    loaded the state the training process published for this iteration."""

    def __init__(self, dataset: StreamingDataset, shared: _IterationState) -> None:
        self.dataset, self.shared = dataset, shared

    def __iter__(self) -> Iterator[Any]:
        _start_worker_iteration(self.dataset, self.shared, None)
        yield from self.dataset

    def __len__(self) -> int:
        return len(self.dataset)


def _regroup(items: Iterator[list[Any]], group: int) -> Iterator[list[Any]]:
    """Lists of `group` batches out of lists of one: without workers, one DataLoader item then carries
    `group` batches, so torch's per-item cost (fetcher, profiler hooks: ~20-40 us) is paid once per group
    rather than once per 256 KB batch."""
    batches = itertools.chain.from_iterable(items)
    while chunk := list(itertools.islice(batches, group)):
        yield chunk


def _refs_possible(dataset: StreamingDataset, batch_path: bool) -> bool:
    """Only fixed-size columns, and the reading method the loader would call is not overridden (a
    subclass transforming samples in `__iter__`, batches in `iter_batches`, or samples in `__getitem__` /
    `get_item` / `transform=` must see them)."""
    method = "iter_batches" if batch_path else "__iter__"
    if getattr(type(dataset), method) is not getattr(StreamingDataset, method) or dataset.transforms_samples():
        return False
    return all(all_fixed_size(st.entries[:1], dataset.columns) for st in dataset.streams)


def _ring_for(dataset: StreamingDataset, workers: int) -> SlotRing | None:
    """A slot ring sized for the largest per-device batch any stream gives (fixed-size columns only)."""
    largest = 0
    for st in dataset.streams:
        entry = st.entries[0]
        layout = tuple((name, lookup_encoding(enc).dtype.str, tuple(lookup_encoding(enc).shape))
                       for name, enc in zip(entry.column_names, entry.column_encodings, strict=True)
                       if dataset.columns is None or name in dataset.columns)
        largest = max(largest, slot_bytes(layout, dataset.batch_size))
    return SlotRing.sized_for(workers, largest)


def _collate_each(collate: Callable[[Any], Any], batches: list[Any]) -> list[Any]:
    """Runs in the worker: the batch path's collate on every batch of a group."""
    return [collate(b) for b in batches]


def _as_is(item: Any) -> Any:
    return item


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
        shared = _IterationState() if kwargs.get("persistent_workers") and kwargs.get("num_workers") else None
        self._shared = shared
        self._auto_context = kwargs.get("multiprocessing_context") is None
        self.streaming_dataset = dataset
        self.batch_path = batch_path
        user_collate = kwargs.pop("collate_fn", None)
        # Workers hand over BatchRefs (gather.py) unless a collate_fn must see the data in the worker. With
        # the default collate and only fixed-size columns, collating samples gives exactly the stacked
        # tensors a batch gather gives, so the per-sample path takes that route too.
        self._refs = kwargs.get("num_workers", 0) > 0 and user_collate is None and _refs_possible(dataset, batch_path)
        self._grouped = batch_path or self._refs  # DataLoader items are groups of whole batches
        kwargs["worker_init_fn"] = functools.partial(_worker_start, kwargs.get("worker_init_fn"))
        if self._grouped:
            # Only an epoch's last per-device batch can be partial; drop_last drops it, as torch would.
            self._drop_last = bool(kwargs.pop("drop_last", False))
            self._batch_collate = user_collate or _to_tensors
            collate = _as_is if self._refs else functools.partial(_collate_each, self._batch_collate)
            # Groups of batches per item: workers send BatchRefs of REF_GROUP batches; without workers the
            # batch path's items carry REF_GROUP batches too (one reader, so the order is unchanged).
            group = REF_GROUP if self._refs or not kwargs.get("num_workers") else 1
            super().__init__(_BatchView(dataset, group, self._refs, shared), batch_size=None, collate_fn=collate,
                             **kwargs)
            object.__setattr__(self, "batch_size", batch_size)  # as on the per-sample path (torch forbids set)
        else:
            super().__init__(dataset if shared is None else _SampleView(dataset, shared), batch_size=batch_size,
                             collate_fn=user_collate or collate_samples, **kwargs)
        self._epoch = dataset._epoch
        self._batches_seen = 0
        self._ring: SlotRing | None = None  # made at the first iteration whose workers fork (slots.py)
        self._ring_in_use = False

    def __iter__(self) -> Iterator[Any]:
        ds = self.streaming_dataset
        ds.set_epoch(self._epoch)
        self._batches_seen = 0
        if self._shared is not None:
            self._shared.publish(ds)  # before the DataLoader tells persistent workers to start again
        if self.num_workers > 0 and self._iterator is None:
            ds.warm_plan()  # fork()ed workers share this process's plan of the epoch
        with fork_gate() as gate_open:  # decide and fork workers in one step (tessera.storage.fork_gate)
            if self._iterator is None:  # workers start (persistent ones only the first time)
                if self._auto_context and self.num_workers > 0:
                    self.multiprocessing_context = _worker_context() if _needs_clean_workers(ds, gate_open) else None
                self._take_ring()
            items = super().__iter__()  # workers start here
        try:
            for item in items:
                for batch in self._batches_of(item):
                    self._batches_seen += 1
                    yield batch
        finally:
            del items  # the DataLoader iterator: dropping it stops this iteration's workers (they fill
            self._ring_in_use = False  # slots of the ring) before another iteration may take the ring
            if self._refs:
                ds._close_readers()  # the mappings (and pins) this process opened to gather
                if os.environ.get("TESSERA_STREAM_PROFILE"):
                    slots = f", {self._ring.handed_out} batches from shared slots" if self._ring else ""
                    print(f"[tessera.stream] training process: gather (of the workers' BatchRefs)+consume "
                          f"{ds.stage_times.decode:.2f}s{slots}", file=sys.stderr)
                if self._ring is not None:
                    self._ring.handed_out = 0
                ds.stage_times.reset()
        self._epoch += 1  # a finished epoch: the next iteration starts the next one from its start
        ds.set_epoch(self._epoch)
        ds._resume = None
        self._batches_seen = 0

    def _batches_of(self, item: Any) -> Iterator[Any]:
        if not self._grouped:
            yield item
        elif self._drop_last:
            size = self.streaming_dataset.batch_size
            yield from (b for b in self._grouped_batches(item) if _batch_rows(b) == size)
        else:
            yield from self._grouped_batches(item)

    def _grouped_batches(self, item: Any) -> Iterator[Any]:
        if not self._refs:
            yield from item
        else:  # made here, after torch's pin-memory thread has seen the item: pin as it would
            pin = self.pin_memory and torch.accelerator.is_available()
            for batch in self.streaming_dataset.gather_refs(item, self.dataset.ring):  # type: ignore[union-attr]
                batch = self._batch_collate(batch)
                yield pin_memory(batch) if pin else batch

    def _take_ring(self) -> SlotRing | None:
        """The slot ring for this iteration's workers, set on the wrapped dataset before they fork: only
        with the BatchRefs handoff and fork()ed workers, and not while an earlier iteration of this loader
        still runs (its workers could still be filling slots)."""
        forked = (self.multiprocessing_context or multiprocessing.get_context()).get_start_method() == "fork"
        ring = None
        if self._refs and forked and not self._ring_in_use:
            if self._ring is None:
                self._ring = _ring_for(self.streaming_dataset, self.num_workers)
            ring = self._ring
            if ring is not None:
                ring.reset()
        self._ring_in_use = ring is not None
        if isinstance(self.dataset, _BatchView):
            self.dataset.ring = ring
        return ring

    def __len__(self) -> int:
        """Batches in one epoch (DataLoader items may each carry several)."""
        if self._grouped:
            whole, part = divmod(len(self.streaming_dataset), self.streaming_dataset.batch_size)
            return whole + (part > 0 and not self._drop_last)
        return super().__len__()

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
