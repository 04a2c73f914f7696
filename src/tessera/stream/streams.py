"""`Stream`: one MDS dataset in a mix, and what the dataset needs to know about it at start-up.

Everything that can be wrong with a stream (no remote and no local data, a missing index, weights
that do not mix) is found here, before a single shard is downloaded.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from tessera.shards.errors import DatasetNotFound, EmptyIndex
from tessera.shards.index import INDEX_BASENAME, ShardEntry
from tessera.shards.packed_index import PackedIndex, open_packed
from tessera.shards.reader import ShardReader
from tessera.shards.text_reader import open_shard_reader
from tessera.storage import RetryPolicy, Store, open_store
from tessera.storage.url import parse_url
from tessera.stream.batching.mixing import StreamShards, resolved_weights
from tessera.stream.cache import ShardCache
from tessera.stream.config import StreamConfig
from tessera.stream.index_fetch import fetch_index
from tessera.stream.integrity import check_hash_recorded


@dataclass
class Stream:
    """One dataset of the mix, with MosaicML Streaming's parameter names.

    `remote` is where the shards live (any storage URL, or None when `local` already holds them);
    `local` is the cache folder (default: a folder under the system temp dir named after the remote).
    At most one of `proportion`, `repeat`, `choose` weights the stream.
    """

    remote: str | None = None
    local: str | None = None
    split: str | None = None
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None
    download_retry: int | None = None
    download_timeout: float | None = None
    validate_hash: str | None = None
    keep_zip: bool | None = None

    def __post_init__(self) -> None:
        """Checked by the stream layer's one description of a stream (config.py); the arguments are kept
        as given (a Path stays a Path)."""
        StreamConfig.check(**{name: getattr(self, name) for name in StreamConfig.model_fields})


def default_local(remote: str) -> str:
    """A cache folder per remote, so two datasets never share shard names. A local remote is named by its
    absolute path: `./data/mds` in two project folders are two datasets, and their equally sized shards
    must not be taken for each other's."""
    parsed = parse_url(remote)
    key = str(Path(parsed.prefix).resolve()) if parsed.is_local else remote
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "tessera-cache", digest)


def local_root_of(spec: Stream) -> Path:
    """The folder holding this stream's index.json and cached shards."""
    local = Path(spec.local or default_local(spec.remote))  # type: ignore[arg-type]
    return local / spec.split if spec.split else local


def has_remote_copy(spec: Stream) -> bool:
    """False when the folder is the only copy: no remote, or a remote naming the local folder itself
    (MosaicML allows remote == local); such a folder is never evicted from and its compressed files stay."""
    if spec.remote is None:
        return False
    parsed = parse_url(spec.remote)
    remote_root = Path(parsed.prefix) / (spec.split or "")
    return not parsed.is_local or remote_root.resolve() != local_root_of(spec).resolve()


@dataclass
class LoadedStream:
    """A stream after start-up: its index (packed, mapped: packed_index.py), its cache, and its place in
    the global sample space. `entries` is the packed index itself: a sequence of ShardEntry rebuilt on
    demand, never a list of them."""

    spec: Stream
    packed: PackedIndex
    fingerprint: str  # xxh64 of index.json's bytes (in the plan's fingerprint, so in resume states)
    cache: ShardCache
    local_root: Path
    remote_store: Store | None
    label: str
    weights: tuple[float | None, float | None, int | None] = (None, None, None)  # as given: `given_weights`
    granularity: int = 1  # the dataset's sampling_granularity (batching/mixing.py)

    @property
    def entries(self) -> Sequence[ShardEntry]:
        return self.packed

    def shards(self) -> StreamShards:
        proportion, repeat, choose = self.weights
        return StreamShards(self.packed.samples, proportion=proportion, repeat=repeat, choose=choose,
                            granularity=self.granularity, sample_base=self.packed.sample_base)

    def __getattr__(self, name: str) -> Any:
        """MosaicML's `ds.streams[i]` is the Stream itself: what this object lacks (`remote`, `split`, the
        resolved `proportion`, a registered Stream subclass's own fields) is read from the Stream."""
        if name.startswith("__") or name in ("spec", "packed"):  # copy/pickle probe before __dict__ is set
            raise AttributeError(name)
        return getattr(self.spec, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: N802
        """The Stream's class, so `isinstance(ds.streams[i], MyStream)` holds for the user's own subclass, as
        in MosaicML; `type()` still tells this object from the Stream it reads through to."""
        return type(self.spec)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled field by field (pickle's default would rebuild an object of `__class__`)."""
        return LoadedStream, tuple(getattr(self, f.name) for f in fields(self))

    @property
    def local(self) -> str:
        """The cache folder (without the split), as MosaicML's `Stream.local`: the one chosen when the stream
        was loaded (a relative remote's default cache follows the folder the dataset was made in)."""
        if self.spec.local:
            return self.spec.local
        return str(self.local_root.parent if self.spec.split else self.local_root)

    def open_reader(self, shard: int, path: Path, columns: list[str] | None,
                    allow_unsafe_types: bool) -> ShardReader:
        entry = self.entries[shard]
        label = (self.remote_store.url_for(entry.raw_data.basename) if self.remote_store
                 else str(self.local_root / entry.raw_data.basename))
        self.cache.verify(entry, path, label)  # validate_hash: on the file's first use in this process
        check = (self.cache.validate_hash,) if self.cache.validate_hash else ()  # meta files of text shards
        return open_shard_reader(path, entry, self.local_root, self.remote_store, columns=columns,  # type: ignore[return-value]
                                 allow_unsafe_types=allow_unsafe_types, label=label, shard=shard, check=check)


class ShardIds(Sequence[tuple[int, int]]):
    """Global shard id -> (stream, shard in the stream), from the streams' shard counts (no list of pairs)."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.starts = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, shard: Any) -> Any:
        if isinstance(shard, slice):
            return [self[i] for i in range(*shard.indices(len(self)))]
        shard = int(shard)
        if not 0 <= shard < len(self):
            raise IndexError(f"shard {shard} is out of range for {len(self)} shards")
        if self.starts.size == 2:
            return 0, shard
        stream = int(np.searchsorted(self.starts, shard, side="right")) - 1
        return stream, shard - int(self.starts[stream])


def given_weights(spec: Stream) -> tuple[float | None, float | None, int | None]:
    """The (proportion, repeat, choose) the user gave. A dataset writes the resolved weights back onto its
    Streams (`write_back_weights`); the originals are kept so the same Stream can build another dataset."""
    current = (spec.proportion, spec.repeat, spec.choose)
    if spec.__dict__.get("_resolved_weights") == current:
        return spec.__dict__["_given_weights"]
    return current


def write_back_weights(streams: list[LoadedStream], choose: np.ndarray) -> None:
    """Set the weights a dataset resolved (samples per epoch `choose`) onto its Streams, as MosaicML's
    `Stream.apply_weights` does: `stream.proportion`, `.repeat` and `.choose` then all hold values."""
    for st, resolved in zip(streams, resolved_weights([st.shards() for st in streams], choose), strict=True):
        given = given_weights(st.spec)
        st.spec.proportion, st.spec.repeat, st.spec.choose = resolved
        st.spec.__dict__.update(_given_weights=given, _resolved_weights=resolved)


def check_unsafe_columns(streams: list[LoadedStream], columns: list[str] | None, allowed: bool) -> None:
    """Refuse pkl columns that would be decoded, unless the caller allowed unsafe types."""
    for st in streams if not allowed else ():
        for entry in st.entries[:1]:
            for name, enc in zip(entry.column_names, entry.column_encodings, strict=True):
                if enc == "pkl" and (columns is None or name in columns):
                    raise ValueError(f"{st.label}: column {name!r} is pkl (unpickling runs code from the "
                                     "data); pass allow_unsafe_types=True if you trust it")


def load_stream(spec: Stream, *, download_retry: int, download_timeout: float, validate_hash: str | None,
                keep_zip: bool, cache_limit: int | None, peer_roots: list[Path]) -> LoadedStream:
    """Fetch the stream's index (fresh from the remote on every start), map its packed form (packing it
    once per node: packed_index.py) and set up its cache."""
    retry = RetryPolicy(max_attempts=(spec.download_retry if spec.download_retry is not None
                                      else download_retry) + 1,
                        request_timeout=spec.download_timeout or download_timeout)
    remote = None
    if has_remote_copy(spec):
        remote = open_store(spec.remote, retry=retry)
        remote = remote.child(spec.split) if spec.split else remote
    local_root = local_root_of(spec)
    label = remote.url_for(INDEX_BASENAME) if remote else str(local_root / INDEX_BASENAME)
    cache = ShardCache(local_root, remote, cache_limit=cache_limit,  # first: it claims the folder (local_claim.py)
                       validate_hash=spec.validate_hash or validate_hash,
                       keep_zip=spec.keep_zip if spec.keep_zip is not None else keep_zip,
                       peer_roots=peer_roots)
    if remote is not None:
        fetch_index(remote, local_root, label)
    try:
        packed = open_packed(local_root / INDEX_BASENAME, label, beside=remote is not None)
    except FileNotFoundError:
        raise DatasetNotFound(f"{label}: no index.json and no remote to fetch it from") from None
    if not packed.samples.any():
        raise EmptyIndex(label, f"Stream contains no samples: {len(packed)} shards, none with a sample")
    check_hash_recorded(packed.layout_shards(), spec.validate_hash or validate_hash, label)
    return LoadedStream(spec, packed, packed.fingerprint, cache, local_root, remote, label, given_weights(spec))
