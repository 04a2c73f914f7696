"""Defaults that depend on the dataset and the world: MosaicML's `num_canonical_nodes`, and the shuffle
block under a cache limit. Pure functions of what the dataset has loaded."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tessera.stream.cache_limit import shards_fit

if TYPE_CHECKING:
    from tessera.stream.streams import LoadedStream


def cache_fitted_block(cache_limit: int, streams: list[LoadedStream], lanes: int) -> int | None:
    """The default shuffle block under a cache limit: samples of at most a quarter of the shards that fit,
    per lane (at least one shard), or None (MosaicML's default) when that is not smaller.

    A block's samples are read in random order, so all its shards are needed until it ends: with
    MosaicML's default (4M samples / lanes, often the whole dataset) under a limit of a fraction of the
    dataset, every batch needed shards just evicted and each was downloaded again and again. A quarter
    leaves room for the next block's shards, other readers of the node and prefetching. An explicit
    `shuffle_block_size` is always kept; the block size is in the resume state, so a resume under
    another limit continues the same order.
    """
    fits = shards_fit(cache_limit, streams)
    remote = [st.packed.samples for st in streams if st.remote_store is not None]
    if not remote or not sum(len(r) for r in remote):
        return None
    per_shard = int(np.median(np.concatenate(remote)))
    block = max(1, fits // 4 // lanes) * per_shard
    return block if block < max(4_000_000 // lanes, 1 << 18) else None


def default_lanes(shuffle_algo: str, num_nodes: int, num_samples: int) -> int:
    """MosaicML's default `num_canonical_nodes`: 64 per node for py1s/py2s, else one per node (so one
    process reads an unshuffled dataset in index order); never more lanes than samples."""
    per_node = 64 if shuffle_algo in ("py1s", "py2s") else 1
    return max(1, min(per_node * num_nodes, num_samples))
