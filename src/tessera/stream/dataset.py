"""`StreamingDataset`: MDS shards from any bucket into PyTorch, deterministic, elastic and resumable.

Parameter names follow MosaicML Streaming so switching is an import change (differences:
docs/streaming.md). The sample order is owned by the pure epoch plan (the `batching` package); this
module only does I/O around it: which shard to fetch next (`prefetch.py`), reading samples from the
shards it holds open (`open_shards.py`), saving and loading the resume state (`resume_state.py`), and
handing batches from DataLoader workers to the training process (`worker_batches.py`).

Global batch t of an epoch is S[start + t*G : start + (t+1)*G] with G = batch_size * data-parallel
ranks, whatever the number of nodes, ranks or DataLoader workers. The last global batch is completed
by wrapping around to the start of S (counted in `padding`), so every rank gets the same number of
samples and DDP never waits on a rank that ran out. That is batching_method="random"; "stratified",
"per_stream" and "device_per_stream" use one sequence per stream (`batching/methods.py`).
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from tessera.shards.encodings import lookup_encoding
from tessera.shards.reader import ShardReader
from tessera.shards.sizes import parse_count, parse_size
from tessera.stream.batching.device_layout import DeviceLayout, group_sizes
from tessera.stream.batching.epoch_plan import PlanConfig, RunPlan
from tessera.stream.batching.methods import Batching, check_batching_settings, reader_batches
from tessera.stream.batching.mixing import check_granularity
from tessera.stream.batching.random_batches import BatchSchedule
from tessera.stream.batching.resume_state import (
    PlanState,
    check_batching,
    checked_state,
    read_state,
    resumed_config,
    save_state,
)
from tessera.stream.batching.stream_batches import StreamSchedule
from tessera.stream.cache import raise_open_file_limit
from tessera.stream.cache_limit import check_cache_limit
from tessera.stream.defaults import cache_fitted_block, default_lanes
from tessera.stream.gather import gather, stack_samples
from tessera.stream.mosaic_api import MosaicDatasetAPI
from tessera.stream.open_shards import OpenShards, open_limit
from tessera.stream.plan_files import PlanFiles
from tessera.stream.prefetch import NoPrefetch, Prefetcher
from tessera.stream.registry import build_stream
from tessera.stream.stage_times import StageTimes
from tessera.stream.streams import (
    LoadedStream,
    ShardIds,
    Stream,
    check_unsafe_columns,
    has_remote_copy,
    load_stream,
    local_root_of,
    write_back_weights,
)
from tessera.stream.worker_batches import WorkerBatches
from tessera.stream.world import World


def _shard_base(streams: Sequence[LoadedStream]) -> np.ndarray:
    """The first global sample id of every shard, then the total: one stream's is its packed index's
    mapped `sample_base` (shared by every process of the node), several streams' a new array."""
    if len(streams) == 1:
        return streams[0].packed.sample_base
    sizes = np.concatenate([st.packed.samples for st in streams])
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _map_nested(fn: Callable[[Any], Any], samples: Any) -> Any:
    """`fn` on every sample of a (possibly nested) list of samples, as `ds[...]` returns them."""
    return [_map_nested(fn, x) if isinstance(x, list) else fn(x) for x in samples]


class StreamingDataset(MosaicDatasetAPI, WorkerBatches, IterableDataset):
    """Stream one or more MDS datasets; see the module docstring and docs/streaming.md."""

    def __init__(self, *, streams: Sequence[Stream] | None = None, remote: str | None = None,
                 local: str | None = None, split: str | None = None, download_retry: int = 2,
                 download_timeout: float = 60.0, validate_hash: str | None = None, keep_zip: bool = False,
                 epoch_size: int | str | None = None, predownload: int | None = None,
                 cache_limit: int | str | None = None, sampling_method: str = "balanced",
                 sampling_granularity: int = 1, partition_algo: str = "orig",
                 num_canonical_nodes: int | None = None, batch_size: int | None = None, shuffle: bool = False,
                 shuffle_algo: str = "py1e", shuffle_seed: int = 9176, shuffle_block_size: int | None = None,
                 batching_method: str = "random", allow_unsafe_types: bool = False,
                 replication: int | None = None,
                 columns: Sequence[str] | Callable[[list[LoadedStream]], Sequence[str] | None] | None = None,
                 ranged_reads: bool = True, stream_name: str = "stream",
                 stream_config: dict[str, Any] | None = None,
                 transform: Callable[[dict[str, Any]], Any] | None = None) -> None:
        if streams and (remote is not None or local is not None):
            raise ValueError("pass either streams=[...] or remote/local, not both")
        if streams and (stream_name != "stream" or stream_config):
            raise ValueError("stream_name/stream_config build the dataset's one stream from remote/local; "
                             "with streams=[...] construct those Streams yourself")
        self.sampling_granularity = check_granularity(sampling_granularity)
        self.initial_physical_nodes: int | None = None  # MosaicML's: the node count of the first run
        self._batching = Batching(batching_method, int(batch_size or 1))
        self.batching_method = self._batching.method
        if partition_algo not in ("orig", "relaxed"):
            raise ValueError(f"unknown partition_algo {partition_algo!r}")
        specs = list(streams) if streams else [build_stream(
            stream_name, stream_config, remote=remote, local=local, split=split, download_retry=download_retry,
            download_timeout=download_timeout, validate_hash=validate_hash, keep_zip=keep_zip)]
        for spec in specs:
            if spec.split is None and split is not None:
                spec.split = split
        self.batch_size = int(batch_size or 1)
        self.replication = int(replication or 1)
        self.predownload = predownload
        self._warn_predownload()
        self.allow_unsafe_types = allow_unsafe_types
        self.cache_limit = parse_size(cache_limit) if cache_limit is not None else None
        world = World.from_env()
        self._check_world(world)
        raise_open_file_limit()
        # cache_limit bounds (and evicts from) the folders of remote streams only: a local-only stream's
        # folder is the data itself, with no other copy, and must never be evicted from.
        roots = [local_root_of(s) for s in specs if has_remote_copy(s)]
        self.streams: list[LoadedStream] = [
            load_stream(s, download_retry=download_retry, download_timeout=download_timeout,
                        validate_hash=validate_hash, keep_zip=keep_zip, cache_limit=self.cache_limit,
                        peer_roots=roots) for s in specs]
        for st in self.streams:
            st.granularity = self.sampling_granularity
        check_cache_limit(self.cache_limit, self.streams)
        # The columns to decode; a function chooses them from the loaded streams' indexes (what a caller
        # can only know once index.json is read, without reading it a second time).
        chosen = columns(self.streams) if callable(columns) else columns
        self.columns = list(chosen) if chosen else None
        check_unsafe_columns(self.streams, self.columns, allow_unsafe_types)
        self._entries = ShardIds([len(st.entries) for st in self.streams])
        self.stage_times = StageTimes()
        self._shards = OpenShards(self.streams, self._entries, columns=self.columns,
                                  allow_unsafe_types=allow_unsafe_types, cache_limit=self.cache_limit,
                                  ranged_reads=ranged_reads, times=self.stage_times,
                                  max_open=open_limit(self.cache_limit, self.streams, world))
        self._shard_base = _shard_base(self.streams)
        lanes = num_canonical_nodes or default_lanes(shuffle_algo, world.num_nodes, self.num_samples)
        if shuffle and shuffle_block_size is None and self.cache_limit is not None:
            shuffle_block_size = cache_fitted_block(self.cache_limit, self.streams, lanes)
        self._config = PlanConfig(seed=shuffle_seed, num_lanes=lanes, shuffle=shuffle, shuffle_algo=shuffle_algo,
                                  shuffle_block_size=shuffle_block_size,
                                  epoch_size=parse_count(epoch_size) if epoch_size is not None else None,
                                  sampling_method=sampling_method,
                                  dataset_fingerprint=":".join(st.fingerprint for st in self.streams))
        self._run = self._run_plan(self._config)
        write_back_weights(self.streams, self._run.units.choose)  # stream.proportion/repeat/choose, as MosaicML
        check_batching_settings(self.batching_method, [c for c in self._run.units.choose.tolist() if c > 0],
                                self.global_batch_size(world), self.batch_size)  # before any download
        self._epoch = 0
        self._resume: PlanState | None = None
        self._epoch_used = False  # an iteration of self._epoch started (the next one starts the next epoch)
        self.transform = transform
        self.warm_plan()  # the first batch needs it: built here, fork()ed workers of any DataLoader share it

    # --- pickling (spawn and forkserver DataLoader workers) ---------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Small: each stream's packed index pickles as its location (the worker maps the same file), and
        what derives from the packed arrays (`_shard_base`, the run plan) is derived again on arrival."""
        return {**self.__dict__, "_shard_base": None, "_run": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._shard_base = _shard_base(self.streams)
        self._run = self._run_plan(self._config)
        self._batching.forget_plans()

    def _run_plan(self, config: PlanConfig) -> RunPlan:
        """The run plan of `config`, its epochs' lanes shared by the node's processes (plan_files.py)."""
        run = RunPlan([st.shards() for st in self.streams], config)
        run.store = PlanFiles(run.fingerprint)
        return run

    def warm_plan(self) -> None:
        """Build the plan of the epoch the next iteration serves, before DataLoader workers fork: they then
        share its pages with this process instead of each building its own."""
        self._epoch_samples(self._epoch + (1 if self._epoch_used else 0), self.global_batch_size())

    # --- checks -----------------------------------------------------------------------------------
    def _check_world(self, world: World) -> None:
        if world.world_size % self.replication:
            raise ValueError(f"replication={self.replication} does not divide world size {world.world_size}")

    # --- sizes --------------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Samples stored in all streams (before weighting): the range of `ds[i]`."""
        return int(self._shard_base[-1])

    def _layout(self, world: World, group: int = 1) -> DeviceLayout:
        r = self.replication
        per_node = world.local_world_size // r if world.local_world_size % r == 0 else None
        return DeviceLayout(world_size=world.world_size // r, rank=world.rank // r,
                            ranks_per_node=per_node if per_node else None,
                            num_workers=world.num_workers if world.num_workers > 1 else 0,
                            worker_id=world.worker_id, group=group)

    def global_batch_size(self, world: World | None = None) -> int:
        world = world or World.from_env()
        return self.batch_size * (world.world_size // self.replication)

    def __len__(self) -> int:
        """Samples this rank reads in one epoch (every rank reads the same number)."""
        world = World.from_env()
        G = self.global_batch_size(world)
        n = self._epoch_samples(self._epoch, G)
        if self.batching_method != "random":  # the other methods fill every batch (stream_batches.py)
            return math.ceil(n / G) * self.batch_size
        return math.ceil(n / (G // self.batch_size))  # the last batch is padded only to a multiple of ranks

    def _epoch_samples(self, epoch: int, G: int) -> int:
        """Positions served in an epoch before the wrap-around of its last global batch."""
        return self._batching.epoch_samples(self._run, epoch, G)

    # --- random access --------------------------------------------------------------------------------
    def _locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shard = np.searchsorted(self._shard_base, ids, side="right") - 1
        return shard, ids - self._shard_base[shard]

    def _reader(self, shard: int, prefetcher: Prefetcher | None = None) -> ShardReader:
        return self._shards.reader(shard, prefetcher)

    def _fetch(self, shard: int) -> Path:
        return self._shards.fetch(shard)

    def _close_readers(self) -> None:
        self._shards.close_readers()

    # --- epochs and resumption --------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration serves (StreamingDataLoader calls this for you). Without it, each
        new iteration of the dataset starts the next epoch, as in MosaicML Streaming."""
        self._epoch, self._epoch_used = int(epoch), False

    def _begin(self) -> tuple[int, int]:
        """(epoch, samples already consumed in it) for the iteration about to start."""
        if self._resume is not None and self._resume.epoch == self._epoch:
            return self._epoch, self._resume.samples_consumed
        return self._epoch, 0

    def state_dict(self, num_samples: int, from_beginning: bool = True) -> dict[str, Any]:
        """Resume state after `num_samples` samples of the current epoch, counted over all ranks.

        `from_beginning=False` counts from where this iteration resumed, as MosaicML Streaming does.
        """
        epoch, start = self._begin()
        consumed = num_samples if from_beginning else start + num_samples
        G = self.global_batch_size()
        state = save_state(self._run, epoch, consumed, self._epoch_samples(epoch, G), self.batching_method, G,
                           self.batch_size)
        return {**state, **self._mosaic_state_keys()}

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        """Continue the global order exactly where `obj` stopped, on any world size or worker count."""
        state = read_state(obj, self._config)
        self.initial_physical_nodes = obj.get("initial_physical_nodes")
        check_batching(obj, self.batching_method, self.global_batch_size(), self.batch_size)
        config = resumed_config(state, self._config)
        if config is not self._config:  # S depends on the lanes and block size: the saved ones rule
            self._config, self._run = config, self._run_plan(config)
        state = checked_state(self._run, state)
        n = self._epoch_samples(state.epoch, self.global_batch_size())
        if state.samples_consumed >= n:  # the epoch was finished: start the next one
            self._epoch, self._resume, self._epoch_used = state.epoch + 1, None, False
            return
        self._epoch, self._resume, self._epoch_used = state.epoch, state, False

    # --- iteration --------------------------------------------------------------------------------------
    def _schedule(self, group: int = 1) -> tuple[BatchSchedule | StreamSchedule, DeviceLayout]:
        world = World.from_env()
        self._check_world(world)
        self._shards.max_open = open_limit(self.cache_limit, self.streams, world)
        layout = self._layout(world, group)
        epoch, start = self._begin()
        sched = self._batching.schedule(self._run, epoch, self.global_batch_size(world), start)
        sched.check_layout(layout)
        return sched, layout

    def _prefetcher(self, sched: BatchSchedule | StreamSchedule, layout: DeviceLayout) -> Prefetcher:
        if all(st.remote_store is None for st in self.streams):  # local-only: nothing to fetch (prefetch.py)
            return NoPrefetch()
        window = self.predownload if self.predownload is not None else max(8 * self.batch_size, 512)
        # Under a cache limit eviction needs each shard's next need (needs renewed every batch) and
        # prefetches go in need order (see Prefetcher), no further ahead than this process's share of the
        # cache holds: beyond it, other processes sharing the cache would evict what it prefetched.
        limited = self.cache_limit is not None
        if limited:
            window = min(window, max(self.batch_size, self._shards.max_open * self.num_samples // len(self._entries)))
        return Prefetcher(sched.shard_order(layout, renew=self.batch_size if limited else 0), self._shards.prefetch,
                          self._shards.path, window, warm_up=self._warm_up, in_order=limited)

    def _warm_up(self) -> None:
        """Column decoders (image ones import PIL, ~0.15 s) set up while the first shards download."""
        for st in self.streams:
            for name in st.entries[0].column_encodings if st.entries else ():
                lookup_encoding(name)

    def _epoch_batches(self, group: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray, Prefetcher]]:
        """(shard ids, in-shard indices) per rank batch, with the prefetcher kept in step."""
        if self._epoch_used:  # iterating again without set_epoch/load_state_dict: the next epoch (MosaicML's)
            self._epoch, self._resume = self._epoch + 1, None
        self._epoch_used = True
        self._warn_block_size()
        sched, layout = self._schedule(group)
        prefetcher = self._shards.active = self._prefetcher(sched, layout)
        done = 0
        try:
            batches = reader_batches(sched, layout, self._locate)
            sizes = group_sizes(group)  # a worker's groups (DataLoader items)
            while chunk := list(itertools.islice(batches, next(sizes))):
                self._shards.batch(chunk, prefetcher)  # a worker's group of batches at once
                for shards, local in chunk:
                    yield shards, local, prefetcher
                    done += len(shards)
                    prefetcher.advance(done)
        finally:
            prefetcher.close()
            self._shards.end_iteration()
            if os.environ.get("TESSERA_STREAM_PROFILE"):
                print(f"[tessera.stream] {self.stage_times.report(self.streams)}", file=sys.stderr)

    def __getitem__(self, at: Any) -> Any:
        """`ds[i]` as MosaicML's (any index: mosaic_api.py), with `transform` applied to each sample."""
        out = super().__getitem__(at)
        if self.transform is None:
            return out
        return self.transform(out) if isinstance(out, dict) else _map_nested(self.transform, out)

    def transforms_samples(self) -> bool:
        """Whether samples pass through user code: `transform=`, or a subclass overriding `__getitem__` or
        `get_item` (how MosaicML users add transforms). Iteration then reads every sample through
        `self[i]`, and batches are stacked from those samples, never gathered raw."""
        cls = type(self)
        return (self.transform is not None or cls.__getitem__ is not StreamingDataset.__getitem__
                or cls.get_item is not StreamingDataset.get_item)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        custom = self.transforms_samples()
        for shards, local, prefetcher in self._epoch_batches():
            t0 = time.perf_counter()
            if custom:
                yield from (self[i] for i in (self._shard_base[shards] + local).tolist())
            else:
                for shard, index in zip(shards.tolist(), local.tolist(), strict=True):
                    yield self._reader(shard, prefetcher).get(index)
            self.stage_times.decode += time.perf_counter() - t0

    def iter_batches(self) -> Iterator[dict[str, Any]]:
        """Whole per-device batches: fixed-size columns stacked into arrays, others as lists."""
        custom = self.transforms_samples()
        for shards, local, prefetcher in self._epoch_batches():
            t0 = time.perf_counter()
            if custom:
                yield stack_samples([self[i] for i in (self._shard_base[shards] + local).tolist()])
            else:
                yield gather(lambda shard, p=prefetcher: self._reader(shard, p), shards, local, addresses=self._shards.rows)
            self.stage_times.decode += time.perf_counter() - t0
