"""Which shards a reader needs, in the order it first needs them: what prefetch and eviction follow.

Every batching method yields its reader's samples in read order; `first_needs` turns them into
`ShardNeed`s without materialising the epoch, so the prefetcher can keep a window ahead and a cache
under a limit can evict the shard needed furthest in the future.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np


class ShardNeed(NamedTuple):
    """A shard a reader will need: at its `sample_index`-th sample from now, global position `position`."""

    shard: int
    sample_index: int
    position: int


def first_needs(chunks: Iterable[np.ndarray], num_shards: int, skip_samples: int,
                shard_of: Callable[[np.ndarray], np.ndarray] | None = None, renew: int = 0) -> Iterator[ShardNeed]:
    """Each shard in order of first need over `chunks` (a reader's samples in read order), after the
    first `skip_samples` it has already read.

    With `shard_of`, chunk values are global positions, mapped to shards only past the skip (a deep
    resume maps nothing it skips) and reported as `ShardNeed.position`; without, they are shard ids.
    With `renew` > 0, a shard is reported again at its first need in every window of `renew` samples
    (a batch): under a cache limit eviction must know each shard's *next* need, not only its first.
    """
    seen = np.zeros(num_shards, dtype=bool)
    index = 0
    for flat in chunks:
        lo = max(0, skip_samples - index)
        index_base, index = index, index + flat.size
        flat = flat[lo:]
        if not flat.size:
            continue
        shards = flat if shard_of is None else shard_of(flat)
        if renew:  # one np.unique over keys (window, shard)
            window = (index_base + lo + np.arange(flat.size, dtype=np.int64)) // renew
            keys, first = np.unique(window * num_shards + shards, return_index=True)
            uniq = keys % num_shards
        else:
            uniq, first = np.unique(shards, return_index=True)
            fresh = ~seen[uniq]
            uniq, first = uniq[fresh], first[fresh]
            seen[uniq] = True
        for j in np.argsort(first, kind="stable"):
            at = int(first[j])
            yield ShardNeed(int(uniq[j]), index_base + lo + at - skip_samples,
                            -1 if shard_of is None else int(flat[at]))
