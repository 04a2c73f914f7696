"""Stream weighting: how many samples each stream and each shard contributes to an epoch.

Semantics follow MosaicML Streaming's `Stream(proportion=, repeat=, choose=)`:

- Each stream sets at most one of ``proportion`` (relative), ``repeat`` or ``choose`` (absolute).
- Relative weighting: every stream must give a ``proportion``. The epoch has ``epoch_size`` samples
  (default: the total number of underlying samples); stream s gets ``floor(epoch_size * p_s / sum(p))``
  and the few samples lost to rounding go, one each, to streams picked by a seed-keyed draw (fixed for the
  run).
- Absolute weighting: ``repeat=r`` takes ``floor(r * n_s)`` samples of a stream of n_s samples,
  ``choose=c`` takes exactly c, and a stream with no weight takes each of its samples once. Absolute and
  relative weights cannot be mixed, and ``epoch_size`` is only accepted with relative weights, or with no
  weights at all (then streams are sampled in proportion to their size).
- A stream taking ``c = q * n_s + r`` samples (``0 <= r < n_s``) takes every sample q times, plus a
  uniformly random subset of r of its samples. Each shard therefore contributes q "full" units (the whole
  shard) and, when r > 0, one "partial" unit: the shard's share of the subset.
- ``sampling_method="balanced"`` (default) draws the r-subset afresh every epoch from a key including the
  epoch; ``"fixed"`` draws it once per run, so every epoch sees the same samples.

- ``sampling_granularity=g`` (MosaicML's meaning, from its ``get_sampling``): the r-subset is taken from
  shards in granules of g samples. Each shard is cut into ``ceil(n/g)`` granules (its last one may be
  shorter); the granules are put in a random order and taken whole until r samples are reached, the
  last one taken in part. So every shard but at most one contributes a whole number of granules, and a
  large g draws the subset from few shards (fewer downloads). With g = 1 this is a uniform r-subset.

The subset is drawn without materialising it: the per-shard counts come from a multivariate
hypergeometric split (O(shards); with g > 1, O(shards) per halving of the granules: `split_granules`),
and the samples of a shard's partial unit are the images of ``0..count-1`` under a keyed permutation
of the shard (`feistel_permute`): which samples of a shard, as in MosaicML, are uniform at any g.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tessera.stream.shuffle import (
    TAG_REMAINDER_COUNTS,
    TAG_REMAINDER_SUBSET,
    TAG_STREAM_SHORTFALL,
    derive_key,
    feistel_permute,
    hash_words,
    philox,
)

SAMPLING_METHODS = ("balanced", "fixed")
# numpy's hypergeometric sampler requires populations below 10**9; above that a normal approximation of
# the same distribution is indistinguishable and stays within the exact bounds after clipping.
_HYPERGEOMETRIC_LIMIT = 10**9 - 1


@dataclass(frozen=True, eq=False)
class StreamShards:
    """One stream as the plan sees it: the sample count of each of its shards and its weight."""

    shard_sizes: np.ndarray | Sequence[int]
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None
    granularity: int = 1
    sample_base: np.ndarray | None = field(default=None, repr=False)  # first sample id of each shard, then
    # the total (a packed index's mapped `sample_base`): used as is instead of a new array of sums
    sizes: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        sizes = np.asarray(self.shard_sizes, dtype=np.int64).reshape(-1)
        if sizes.size and sizes.min() < 0:
            raise ValueError("shard sample counts must be >= 0")
        sizes.flags.writeable = False
        object.__setattr__(self, "sizes", sizes)
        given = [name for name in ("proportion", "repeat", "choose") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"a stream takes at most one of proportion, repeat, choose; got {', '.join(given)}")
        for name in ("proportion", "repeat"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.choose is not None and (int(self.choose) != self.choose or self.choose < 0):
            raise ValueError(f"choose must be an integer >= 0, got {self.choose!r}")
        check_granularity(self.granularity)

    @property
    def num_samples(self) -> int:
        return int(self.sizes.sum())


def check_granularity(granularity: object) -> int:
    """`sampling_granularity` as an int >= 1 (MosaicML also raises ValueError for others)."""
    if isinstance(granularity, bool) or not isinstance(granularity, (int, np.integer)) or granularity < 1:
        raise ValueError(f"sampling_granularity must be an integer >= 1, got {granularity!r}")
    return int(granularity)


def resolve_choose(streams: Sequence[StreamShards], epoch_size: int | None, seed: int) -> np.ndarray:
    """Samples each stream contributes to every epoch (int64 per stream), with the semantics above."""
    if not streams:
        raise ValueError("no streams given: the dataset is empty")
    if epoch_size is not None and (int(epoch_size) != epoch_size or epoch_size <= 0):
        raise ValueError(f"epoch_size must be a positive integer, got {epoch_size!r}")
    totals = np.array([s.num_samples for s in streams], dtype=np.int64)
    relative = [s.proportion is not None for s in streams]
    unweighted = all(s.proportion is None and s.repeat is None and s.choose is None for s in streams)
    if any(relative) and not all(relative):
        first = relative.index(not relative[0])
        raise ValueError(
            f"stream {first}: proportion (relative) cannot be mixed with repeat/choose/no weight "
            "(absolute); give every stream a proportion, or none of them")
    if all(relative) or (unweighted and epoch_size is not None):
        weights = (np.array([s.proportion for s in streams], dtype=np.float64) if all(relative)
                   else totals.astype(np.float64))
        if weights.sum() <= 0:
            raise ValueError("stream proportions sum to 0: nothing to sample")
        target = int(epoch_size) if epoch_size is not None else int(totals.sum())
        choose = np.floor(target * (weights / weights.sum())).astype(np.int64)
        shortfall = target - int(choose.sum())
        if shortfall:
            eligible = np.flatnonzero(weights > 0)
            picks = philox(seed, TAG_STREAM_SHORTFALL).choice(eligible, shortfall, replace=False)
            choose[picks] += 1
    else:
        if epoch_size is not None:
            raise ValueError("epoch_size needs relative weights (proportion) or no weights; "
                             "with repeat/choose the epoch size is their sum")
        choose = np.empty(len(streams), dtype=np.int64)
        for i, s in enumerate(streams):
            if s.repeat is not None:
                choose[i] = math.floor(s.repeat * totals[i])
            elif s.choose is not None:
                choose[i] = int(s.choose)
            else:
                choose[i] = totals[i]
    empty = np.flatnonzero((totals == 0) & (choose > 0))
    if empty.size:
        raise ValueError(f"stream {int(empty[0])} has no samples but is weighted to give {int(choose[empty[0]])}")
    if choose.sum() == 0:
        raise ValueError("the weighted epoch is empty: no stream contributes any sample")
    return choose


def resolved_weights(streams: Sequence[StreamShards], choose: np.ndarray) -> list[tuple[float, float, int]]:
    """(proportion, repeat, choose) per stream as MosaicML's `Stream.apply_weights` writes them back:
    the proportion normalised over the streams (the given ones when weighting relatively, else each
    stream's share of the samples: stored ones when no stream is weighted, weighted ones otherwise),
    and repeat = choose / the stream's samples (0 for an empty stream)."""
    totals = np.array([s.num_samples for s in streams], dtype=np.float64)
    if all(s.proportion is not None for s in streams):
        share = np.array([s.proportion for s in streams], dtype=np.float64)
    elif all(s.repeat is None and s.choose is None for s in streams):
        share = totals
    else:
        share = np.asarray(choose, dtype=np.float64)
    share = share / share.sum()
    repeat = np.divide(choose, totals, out=np.zeros_like(totals), where=totals > 0)
    return [(float(p), float(r), int(c)) for p, r, c in zip(share, repeat, choose, strict=True)]


def split_count(sizes: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Per-bucket counts of a uniform random `count`-subset of ``sum(sizes)`` items (O(buckets)).

    A multivariate hypergeometric draw, done as a balanced binary tree of hypergeometric splits so that it
    works for populations beyond numpy's 10**9 limit (there the split uses a clipped normal approximation).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    prefix = np.concatenate([[0], np.cumsum(sizes)])
    out = np.zeros(sizes.size, dtype=np.int64)
    lo, hi, k = np.array([0]), np.array([sizes.size]), np.array([int(count)], dtype=np.int64)
    while lo.size:
        leaf = hi - lo == 1
        out[lo[leaf]] = k[leaf]
        lo, hi, k = lo[~leaf], hi[~leaf], k[~leaf]
        if not lo.size:
            break
        mid = (lo + hi) // 2
        good = prefix[mid] - prefix[lo]
        bad = prefix[hi] - prefix[mid]
        left = np.zeros_like(k)
        small = (good + bad <= _HYPERGEOMETRIC_LIMIT) & (k > 0)
        if small.any():
            left[small] = rng.hypergeometric(good[small], bad[small], k[small])
        big = (good + bad > _HYPERGEOMETRIC_LIMIT) & (k > 0)
        if big.any():
            g, b, kk = good[big].astype(float), bad[big].astype(float), k[big].astype(float)
            total = g + b
            mean = kk * g / total
            var = kk * (g / total) * (b / total) * (total - kk) / (total - 1)
            draw = np.rint(rng.normal(mean, np.sqrt(var))).astype(np.int64)
            left[big] = np.clip(draw, np.maximum(0, k[big] - bad[big]), np.minimum(k[big], good[big]))
        lo, hi, k = np.concatenate([lo, mid]), np.concatenate([mid, hi]), np.concatenate([left, k - left])
    return out


def split_granules(sizes: np.ndarray, count: int, granularity: int, rng: np.random.Generator) -> np.ndarray:
    """Per-shard counts of a `count`-subset taken in granules (see the module docstring), O(shards log).

    Granules in a uniformly random order, taken until `count` is reached, is the same as: halve the
    granules not yet decided into a random first half and the rest; if the samples taken so far plus
    the first half reach `count`, the stop lies in the first half (drop the rest), else take the first
    half whole and go on in the rest. Each halving is one `split_count` over (shard, whole or last
    granule) buckets; the granule left at the end is the one taken in part.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if granularity == 1:
        return split_count(sizes, count, rng)
    full, tail = sizes // granularity, sizes % granularity
    # The pool of undecided granules: per shard, whole ones (g samples) and the short last one (0 or 1).
    pool = np.concatenate([full, (tail > 0).astype(np.int64)])
    weight = np.concatenate([np.full(sizes.size, granularity, dtype=np.int64), tail])
    taken = np.zeros_like(pool)
    need = int(count)
    while need > 0 and pool.sum() > 1:
        first = split_count(pool, int(pool.sum()) // 2, rng)
        got = int((first * weight).sum())
        if got >= need:
            pool = first
        else:
            taken, pool, need = taken + first, pool - first, need - got
    if need > 0:  # one granule left: the stop is in it
        last = int(np.flatnonzero(pool)[0])
        taken[last] += 1
        over = int(weight[last]) - need
    else:
        last, over = 0, 0
    counts = (taken * weight).reshape(2, -1).sum(axis=0)
    counts[last % sizes.size] -= over
    return counts


class UnitTable:
    """The shards of all streams resolved into units (run-fixed identity, per-epoch sizes).

    Global sample ids number the samples of all streams' shards in order: stream offset + shard offset
    + index in shard. Shards are numbered the same way across streams. Unit u is shard
    ``unit_shard[u]``, taken whole (``unit_partial[u]`` false) or as its share of the stream's random
    remainder subset (true). Units of empty shards are omitted.

    When every shard is one whole unit (no weights, or weights that take each sample once, and no empty
    shard), unit u is shard u: `unit_shard` and `unit_partial` are then None and nothing per unit is
    held (a single stream's shard sizes and bases are its packed index's mapped arrays).
    """

    def __init__(self, streams: Sequence[StreamShards], choose: np.ndarray, seed: int, sampling_method: str):
        if sampling_method not in SAMPLING_METHODS:
            raise ValueError(f"Invalid sampling method: {sampling_method!r}; sampling_method is one of {SAMPLING_METHODS}")
        self.seed = int(seed)
        self.sampling_method = sampling_method
        self.choose = np.asarray(choose, dtype=np.int64)
        self.granularity = [s.granularity for s in streams]
        one = streams[0] if len(streams) == 1 else None
        self.shard_sizes = one.sizes if one else np.concatenate([s.sizes for s in streams]).astype(np.int64)
        self.shard_base = (one.sample_base[:-1] if one and one.sample_base is not None
                           else np.concatenate([[0], np.cumsum(self.shard_sizes)[:-1]]).astype(np.int64))
        self.stream_shard_start = np.concatenate([[0], np.cumsum([s.sizes.size for s in streams])]).astype(np.int64)
        totals = np.array([s.num_samples for s in streams], dtype=np.int64)
        safe = np.maximum(totals, 1)
        self.stream_full = np.where(totals > 0, self.choose // safe, 0)
        self.stream_remainder = np.where(totals > 0, self.choose % safe, 0)
        self.unit_shard: np.ndarray | None = None
        self.unit_partial: np.ndarray | None = None
        self.num_units = self.shard_sizes.size
        if (self.stream_full == 1).all() and not self.stream_remainder.any() and self.shard_sizes.min(initial=1) > 0:
            return
        counts_per_stream = np.diff(self.stream_shard_start)
        shard_full = np.repeat(self.stream_full, counts_per_stream)
        shard_has_partial = np.repeat(self.stream_remainder > 0, counts_per_stream)
        units_per_shard = np.where(self.shard_sizes > 0, shard_full + shard_has_partial, 0)
        self.unit_shard = np.repeat(np.arange(self.shard_sizes.size, dtype=np.int64), units_per_shard)
        first_unit = np.concatenate([[0], np.cumsum(units_per_shard)[:-1]])
        rep = np.arange(self.unit_shard.size, dtype=np.int64) - np.repeat(first_unit, units_per_shard)
        self.unit_partial = rep == shard_full[self.unit_shard]
        self.num_units = self.unit_shard.size
        self._partial_shard_units = np.full(self.shard_sizes.size, -1, dtype=np.int64)
        self._partial_shard_units[self.unit_shard[self.unit_partial]] = np.flatnonzero(self.unit_partial)

    @property
    def num_samples(self) -> int:
        """Underlying samples over all streams (the range of global sample ids)."""
        return int(self.shard_sizes.sum())

    def shard_of(self, units: np.ndarray) -> np.ndarray:
        """The shard of each unit."""
        return units if self.unit_shard is None else self.unit_shard[units]

    def _sampling_epoch(self, epoch: int) -> int:
        # "fixed" keys every draw by a constant in place of the epoch; epochs are >= 0, so no clash.
        return epoch + 1 if self.sampling_method == "balanced" else 0

    def unit_sizes(self, epoch: int) -> np.ndarray:
        """Samples each unit contributes in `epoch` (partial units vary per epoch when balanced; read-only)."""
        if self.unit_shard is None:
            return self.shard_sizes
        sizes = self.shard_sizes[self.unit_shard]
        word = self._sampling_epoch(epoch)
        for s, remainder in enumerate(self.stream_remainder):
            if remainder == 0:
                continue
            lo, hi = self.stream_shard_start[s], self.stream_shard_start[s + 1]
            counts = split_granules(self.shard_sizes[lo:hi], int(remainder), self.granularity[s],
                                    philox(self.seed, TAG_REMAINDER_COUNTS, word, s))
            units = self._partial_shard_units[lo:hi]
            has_unit = units >= 0
            sizes[units[has_unit]] = counts[has_unit]
        return sizes

    def sample_in_shard(self, units: np.ndarray, offsets: np.ndarray, epoch: int) -> np.ndarray:
        """Index inside its shard of the sample at `offsets` of each unit (offsets already ordered)."""
        if self.unit_partial is None:
            return offsets
        out = offsets.copy()
        partial = self.unit_partial[units]
        if partial.any():
            shards = self.unit_shard[units[partial]]
            key = hash_words(derive_key(self.seed, TAG_REMAINDER_SUBSET, self._sampling_epoch(epoch)), shards)
            out[partial] = feistel_permute(offsets[partial], self.shard_sizes[shards], key)
        return out
