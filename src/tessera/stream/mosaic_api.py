"""MosaicML Streaming's random access and public layout attributes, as a base of `StreamingDataset`.

Code written for MosaicML reads `ds[i]` (any `Array` index: indexing.py), `ds.get_item(i)`,
`ds.shards[i].samples`, `ds.num_shards`, `ds.samples_per_shard` and their kin. They live here, apart
from the I/O and ordering in dataset.py, and are all views of what the dataset already holds: the
streams' index entries and `_shard_base` (the first global sample id of every shard, plus the total).

Subclasses that transform samples override `__getitem__` (as MosaicML's examples do) or `get_item`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tessera.shards.index import FileInfo, ShardEntry
from tessera.stream.batching.methods import Batching, reader_batches
from tessera.stream.indexing import SampleIndexError, select
from tessera.stream.world import World

if TYPE_CHECKING:
    from tessera.shards.reader import ShardReader
    from tessera.stream.batching.device_layout import DeviceLayout
    from tessera.stream.batching.epoch_plan import PlanConfig, RunPlan
    from tessera.stream.open_shards import OpenShards
    from tessera.stream.streams import LoadedStream


class MosaicDatasetAPI:
    """`ds[...]`, `get_item` and MosaicML's read-only attributes (`shards`, `num_shards`, ...)."""

    streams: list[LoadedStream]
    _shard_base: np.ndarray  # int64, one more than the number of shards: first sample id of each, then total
    _entries: Sequence[tuple[int, int]]  # (stream, shard in stream) of every shard (streams.ShardIds)
    _run: RunPlan
    _config: PlanConfig
    initial_physical_nodes: int | None
    predownload: int | None
    batch_size: int

    _shards: OpenShards

    if TYPE_CHECKING:
        def _reader(self, shard: int) -> ShardReader: ...
        def _fetch(self, shard: int) -> Path: ...
        def _layout(self, world: World, group: int = 1) -> DeviceLayout: ...
        def _locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
        def global_batch_size(self, world: World | None = None) -> int: ...

    # --- random access -------------------------------------------------------------------------------
    def __getitem__(self, at: Any) -> Any:
        """A sample for an int (negative counts from the end), a list of samples for a slice, a list or
        an array of ints (nested for nested lists), as MosaicML's `Array`; IndexError out of range."""
        if type(at) is int and 0 <= at < self.size:  # the common case, without the dispatch
            return self.get_item(at)
        return select(at, self.size, self.get_item)

    def get_item(self, sample_id: int) -> dict[str, Any]:
        """The sample with global id `sample_id` (0 <= sample_id < size), fetching its shard if needed."""
        base = self._shard_base
        if not 0 <= sample_id < int(base[-1]):
            raise SampleIndexError(f"sample index {sample_id} is out of range for a dataset of {int(base[-1])} "
                                   "samples")
        shard = int(np.searchsorted(base, sample_id, side="right")) - 1
        return self._reader(shard).get(sample_id - int(base[shard]))

    def _warn_predownload(self) -> None:
        """At construction, MosaicML's warning: a `predownload` below the batch size keeps less than one
        batch of samples downloading ahead of the reader."""
        if self.predownload is not None and self.predownload < self.batch_size:
            warnings.warn(f"predownload < batch_size ({self.predownload} < {self.batch_size}). This may result "
                          "in slower batch time. Recommendation is to set predownload to at least batch_size.",
                          UserWarning, stacklevel=3)

    def _warn_block_size(self) -> None:
        """At the start of each epoch, MosaicML's warning (its py1e's; Tessera's block shuffle behind every
        algorithm but naive has the same limit): a shuffle block smaller than a shard shuffles that shard's
        samples mostly among themselves."""
        config = self._config
        if not config.shuffle or config.algo == "naive":
            return
        largest = max((int(st.packed.samples.max()) for st in self.streams if len(st.entries)), default=0)
        if config.block_size < largest:
            warnings.warn(f"Shuffle block size was smaller than shard size for some shards: shuffle_block_size="
                          f"{config.block_size} < {largest} samples in the largest shard, so such shards are not "
                          "shuffled with other shards. Set shuffle_block_size to a larger value for a higher "
                          "quality shuffle.", UserWarning, stacklevel=4)

    def _mosaic_state_keys(self) -> dict[str, Any]:
        """MosaicML's state keys that Tessera's own state lacks: `initial_physical_nodes` is the node count
        of the run that started the epoch sequence, kept through resumes."""
        nodes = self.initial_physical_nodes
        return {"initial_physical_nodes": nodes if nodes is not None else World.from_env().num_nodes}

    def prepare_shard(self, shard_id: int) -> None:
        """Make shard `shard_id` (numbered over all streams) present in the cache, as MosaicML's does."""
        if not 0 <= shard_id < self.num_shards:
            raise SampleIndexError(f"shard {shard_id} is out of range for a dataset of {self.num_shards} shards")
        self._fetch(shard_id)

    def evict_shard(self, shard_id: int) -> bool:
        """Remove shard `shard_id`'s files from the cache now, as MosaicML's does; it is downloaded again
        when next read. This process's reader of it is closed first. Unlike MosaicML's, a shard another
        process is reading stays (False; MosaicML deletes it under that reader), and a stream without a
        remote copy is refused (its files are the only copy of the data)."""
        if not 0 <= shard_id < self.num_shards:
            raise SampleIndexError(f"shard {shard_id} is out of range for a dataset of {self.num_shards} shards")
        stream, index = self._entries[shard_id]
        self._shards.close_shard(shard_id)
        return self.streams[stream].cache.evict(self.streams[stream].entries[index])

    @property
    def cache_usage(self) -> int:
        """Bytes of shard files in the cache folders of the streams that have a remote (MosaicML's
        `cache_usage`; measured on the disk, so it counts what every process sharing them downloaded)."""
        caches = [st.cache for st in self.streams if st.remote_store is not None]
        return caches[0].space.usage() if caches else 0  # a cache measures every stream's folder (peer_roots)

    # --- sizes (MosaicML's names) ----------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Underlying samples of all streams (MosaicML's `size`: the range of `ds[i]`)."""
        return int(self._shard_base[-1])

    @property
    def epoch_size(self) -> int:
        """Samples in one epoch after stream weighting (MosaicML's `epoch_size`)."""
        return int(self._run.units.choose.sum())

    @property
    def num_streams(self) -> int:
        return len(self.streams)

    @property
    def num_shards(self) -> int:
        return len(self._entries)

    @property
    def shards(self) -> ShardList:
        """One `ShardView` per shard of every stream, in global shard order."""
        return ShardList(self)

    @property
    def samples_per_shard(self) -> np.ndarray:
        return np.diff(self._shard_base)

    @property
    def sample_offset_per_shard(self) -> np.ndarray:
        return self._shard_base[:-1].copy()

    @property
    def shards_per_stream(self) -> np.ndarray:
        return np.array([len(st.entries) for st in self.streams], dtype=np.int64)

    @property
    def shard_offset_per_stream(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.shards_per_stream)[:-1]]).astype(np.int64)

    @property
    def stream_per_shard(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_streams, dtype=np.int64), self.shards_per_stream)

    @property
    def samples_per_stream(self) -> np.ndarray:
        return np.array([int(st.packed.samples.sum()) for st in self.streams], dtype=np.int64)

    @property
    def sample_offset_per_stream(self) -> np.ndarray:
        return self._shard_base[self.shard_offset_per_stream].copy()

    # --- settings as resolved (MosaicML's attribute names); num_canonical_nodes is the lane count of the
    # plan in use, which a loaded resume state may have changed.
    num_canonical_nodes = property(lambda self: self._config.num_lanes)
    shuffle = property(lambda self: self._config.shuffle)
    shuffle_seed = property(lambda self: self._config.seed)
    shuffle_algo = property(lambda self: self._config.shuffle_algo)
    shuffle_block_size = property(lambda self: self._config.block_size)
    sampling_method = property(lambda self: self._config.sampling_method)


class ShardList(Sequence["ShardView"]):
    """`ds.shards`: views made on demand, so a dataset of 10^6 shards builds none until asked."""

    def __init__(self, dataset: MosaicDatasetAPI) -> None:
        self._dataset = dataset

    def __len__(self) -> int:
        return self._dataset.num_shards

    def __getitem__(self, at: Any) -> Any:
        return select(at, len(self), lambda i: ShardView(self._dataset, i), what="shard list")

    def __iter__(self) -> Iterator[ShardView]:
        return (ShardView(self._dataset, i) for i in range(len(self)))


class ShardView:
    """One shard as MosaicML's shard reader presents it: its index entry's fields, sizes, and its samples
    (read through the dataset, so through its cache, pins and hash checks)."""

    def __init__(self, dataset: MosaicDatasetAPI, shard_id: int) -> None:
        self.dataset, self.shard_id = dataset, shard_id
        stream, index = dataset._entries[shard_id]
        loaded = dataset.streams[stream]
        self.stream_id = stream
        self.entry: ShardEntry = loaded.entries[index]
        self.dirname = loaded.local
        self.split = loaded.spec.split or ""

    def __repr__(self) -> str:
        return f"ShardView(shard_id={self.shard_id}, basename={self.entry.raw_data.basename!r}, samples={self.samples})"

    # MosaicML's Reader attributes, from the index entry.
    samples = property(lambda self: self.entry.samples)
    size = samples
    compression = property(lambda self: self.entry.compression)
    hashes = property(lambda self: self.entry.hashes)
    size_limit = property(lambda self: self.entry.size_limit)
    column_names = property(lambda self: self.entry.column_names)
    column_encodings = property(lambda self: self.entry.column_encodings)
    column_sizes = property(lambda self: self.entry.column_sizes)
    raw_data = property(lambda self: self.entry.raw_data)
    zip_data = property(lambda self: self.entry.zip_data)

    @property
    def file_pairs(self) -> list[tuple[FileInfo, FileInfo | None]]:
        return [(self.entry.raw_data, self.entry.zip_data)]

    def __len__(self) -> int:
        return self.entry.samples

    def get_raw_size(self) -> int:
        return self.entry.raw_data.bytes

    def get_zip_size(self) -> int | None:
        return self.entry.zip_data.bytes if self.entry.zip_data else None

    def get_max_size(self) -> int:
        """Bytes on disk while both forms are present (during decompression)."""
        return self.get_raw_size() + (self.get_zip_size() or 0)

    def get_persistent_size(self, keep_zip: bool) -> int:
        return self.get_max_size() if self.entry.compression and keep_zip else self.get_raw_size()

    def get_item(self, idx: int) -> dict[str, Any]:
        """Sample `idx` of this shard (0 <= idx < samples)."""
        return self.dataset.get_item(int(self.dataset._shard_base[self.shard_id]) + normalize_shard_index(self, idx))

    def get_sample_data(self, idx: int) -> bytes:
        """The encoded bytes of sample `idx`, as stored in the shard."""
        return self.dataset._reader(self.shard_id).raw_sample(normalize_shard_index(self, idx))

    def __getitem__(self, at: Any) -> Any:
        return select(at, self.entry.samples, self.get_item, what=f"shard {self.shard_id}")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self.get_item(i) for i in range(self.entry.samples))


def normalize_shard_index(view: ShardView, idx: int) -> int:
    """`idx` checked against the shard's sample count (the raw per-shard reads take no negatives)."""
    if not 0 <= idx < view.entry.samples:
        raise SampleIndexError(f"sample index {idx} is out of range for shard {view.shard_id} "
                               f"({view.entry.raw_data.basename}) of {view.entry.samples} samples")
    return idx


def clean_stale_shared_memory() -> None:
    """MosaicML's clean-up of the named shared memory (/dev/shm) that crashed runs left behind. Tessera
    creates none: batch slots are anonymous shared mappings (slots.py), gone with their processes; the
    files its processes map (packed indexes, plan files) are checked before use and rebuilt when not
    whole; locks are `flock`s the kernel drops with a dead process. So there is nothing stale to clean,
    and this does nothing: provided so that code calling it runs unchanged."""


def generate_work(batching_method: str, dataset: MosaicDatasetAPI, world: World, epoch: int,
                  sample_in_epoch: int) -> np.ndarray:
    """MosaicML's `streaming.base.batching.generate_work`: the sample ids each DataLoader worker of `world`
    reads in `epoch`, from `sample_in_epoch` (counted over all ranks) on, shaped (nodes, ranks per node,
    workers per rank, batches per worker, batch size), -1 where a worker has fewer or a batch is partial.
    Tessera's order, for `batching_method` over the dataset's plan (any method, not only its own); for
    looking at how a world would split an epoch, not needed to iterate."""
    sched = Batching(batching_method, dataset.batch_size).schedule(
        dataset._run, epoch, dataset.global_batch_size(world), sample_in_epoch)
    per_node = world.local_world_size
    workers = []
    for rank in range(world.world_size):
        for worker in range(world.num_workers):
            layout = dataset._layout(World(rank, world.world_size, rank % per_node, per_node, worker, world.num_workers))
            sched.check_layout(layout)
            workers.append([dataset._shard_base[shards] + rows
                            for shards, rows in reader_batches(sched, layout, dataset._locate)])
    out = np.full((len(workers), max(map(len, workers)), dataset.batch_size), -1, dtype=np.int64)
    for w, batches in enumerate(workers):
        for b, ids in enumerate(batches):
            out[w, b, :len(ids)] = ids
    return out.reshape(world.num_nodes, per_node, world.num_workers, *out.shape[1:])
