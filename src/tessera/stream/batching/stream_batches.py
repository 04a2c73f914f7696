"""`batching_method` other than "random": how global batches are drawn from several streams.

"random" (the default) is `random_batches.py` over the plan of `epoch_plan.py`: global batch t is
S[t*G : (t+1)*G] of the mixed sequence S. The methods here keep the mixing weights
(`mixing.resolve_choose`: stream s contributes ``c_s`` samples per epoch) but build **one sequence S_s
per stream**: a `RunPlan` of that stream alone taking ``choose=c_s``, with the run's shuffle settings,
``min(num_lanes, c_s)`` lanes, the run's block size, and a seed derived from (shuffle_seed, stream
index) so that streams of the same shape are not shuffled alike. Each S_s is lazy (O(shards of s)
memory); streams with ``c_s = 0`` take no part.

"stratified": every global batch holds ``g_s`` samples of stream s, ``g_s`` being G * c_s / sum(c) rounded
by largest remainder (ties to the higher stream index, as MosaicML's) to integers that sum to G (a ValueError
if one is 0, as in MosaicML). Global batch t is the concatenation, in stream order, of
``S_s[t*g_s : (t+1)*g_s]``. An epoch has ``min_s floor(len(S_s) / g_s)`` global batches, as MosaicML's
(only whole batch parts): streams whose S_s is longer than ``batches * g_s`` leave their tail unserved in
that epoch (``dropped``, counted per stream by `StratifiedSchedule`; a different random subset every epoch
when shuffled).

"per_stream": every global batch comes from one stream. Stream s contributes ``B_s = floor(len(S_s) / G)``
batches, as MosaicML's (only whole batches; the rest of S_s is left out of the epoch), its k-th being
``S_s[k*G : (k+1)*G]``. The batches of all streams are merged by the fractional position ``(k + 0.5) / B_s`` of batch k
of stream s, ascending, ties to the lower stream index: streams are spread evenly over the epoch. Batch t
of the merge is found in O(streams^2 log batches) (a binary search per stream), so resume never walks the
epoch; consecutive batches then come from a small heap merge.

The positions of a global batch are split among ranks as for "random": "per_stream" uses
`rank_positions` on S_s (lane-aware), "stratified" splits the G concatenated positions contiguously, so
the set of samples in global batch t is the same for every layout. DataLoader workers take a rank's
batches round-robin. Resume state: ``samples_consumed = t * G``, with the batching method and G in it.

"device_per_stream" (every per-device batch from one stream) is in `device_per_stream.py`; `methods.py`
picks a method's schedule.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from fractions import Fraction

import numpy as np

from tessera.stream.batching.device_layout import CHUNK_SAMPLES, DeviceLayout, WorkerBatches, rank_positions
from tessera.stream.batching.epoch_plan import EpochPlan, PlanConfig, RunPlan
from tessera.stream.batching.mixing import StreamShards
from tessera.stream.batching.shard_needs import ShardNeed, first_needs
from tessera.stream.shuffle import derive_key

TAG_BATCHING_STREAM = 9  # per-stream seed of the stream plans (shuffle.py uses tags 1-8)


class StreamPlans:
    """One `RunPlan` per contributing stream of `run`, with the run's weights and shuffle settings."""

    def __init__(self, run: RunPlan):
        self.run = run
        cfg, units = run.config, run.units
        choose = units.choose
        totals = np.array([s.num_samples for s in run.streams], dtype=np.int64)
        sample_base = np.concatenate([[0], np.cumsum(totals)[:-1]]).astype(np.int64)
        self.streams = [s for s in range(len(run.streams)) if choose[s] > 0]
        self.choose = np.array([int(choose[s]) for s in self.streams], dtype=np.int64)
        self.sample_base = sample_base[self.streams]
        self.shard_base = units.stream_shard_start[self.streams]
        self.plans = [
            RunPlan([StreamShards(run.streams[s].sizes, choose=int(choose[s]))],
                    PlanConfig(seed=int(derive_key(cfg.seed, TAG_BATCHING_STREAM, s)),
                               num_lanes=int(min(cfg.num_lanes, choose[s])), shuffle=cfg.shuffle,
                               shuffle_algo=cfg.shuffle_algo, shuffle_block_size=cfg.block_size,
                               sampling_method=cfg.sampling_method))
            for s in self.streams]

    def epoch(self, epoch: int) -> list[EpochPlan]:
        return [p.epoch(epoch) for p in self.plans]


def stratified_counts(choose: np.ndarray | list[int], global_batch_size: int) -> np.ndarray:
    """Samples of each stream per global batch: G * c_s / sum(c) by largest remainder, ties to the higher
    stream index, as MosaicML's. A stream whose part rounds to 0 could not be in every batch: a ValueError
    in MosaicML's words (giving it one sample of every batch would oversample it and cut the epoch short)."""
    G, n = int(global_batch_size), len(choose)
    total = int(sum(int(c) for c in choose))
    quota = [Fraction(G * int(c), total) for c in choose]
    g = [math.floor(q) for q in quota]
    for s in sorted(range(n), key=lambda i: (quota[i] - g[i], i), reverse=True)[:G - sum(g)]:
        g[s] += 1
    for s, part in enumerate(g):
        if part == 0:
            raise ValueError(f"Number of samples for stream {s} is 0 because the portion of this stream in the "
                             f"global batch, which is of size {G}, is too low ({float(quota[s]):.3g} samples); "
                             "increase the global batch size or the stream's proportion "
                             "(batching_method='stratified')")
    return np.array(g, dtype=np.int64)


class StreamSchedule:
    """Global batches t = start/G, ... of an epoch under a per-stream batching method (see module doc)."""

    def __init__(self, plans: StreamPlans, epoch_plans: list[EpochPlan], global_batch_size: int, start: int):
        if int(global_batch_size) != global_batch_size or global_batch_size < 1:
            raise ValueError(f"global batch size must be an integer >= 1, got {global_batch_size!r}")
        self.plans, self.epoch_plans = plans, epoch_plans
        self.global_batch_size = G = int(global_batch_size)
        self.lengths = np.array([len(p) for p in epoch_plans], dtype=np.int64)
        self.total_batches = self._total_batches()
        self.epoch_samples = self.total_batches * G
        if start % G or not 0 <= start <= self.epoch_samples:
            raise ValueError(f"start={start} must be a multiple of the global batch size {G} within the epoch "
                             f"of {self.epoch_samples} samples (batching_method resumes at batch boundaries)")
        self.start = int(start)
        self.first_batch = self.start // G
        self.num_batches = self.total_batches - self.first_batch

    def _total_batches(self) -> int:
        raise NotImplementedError

    def _rank_batches(self, ts: np.ndarray, rank: int, world_size: int, ranks_per_node: int | None,
                      shards: bool = False) -> np.ndarray:
        """Global sample ids (or shard ids) of absolute batches `ts` for `rank`: shape (len(ts), G/W)."""
        raise NotImplementedError

    def samples_consumed(self, batches_done: int) -> int:
        return min(self.epoch_samples, self.start + batches_done * self.global_batch_size)

    def check_layout(self, layout: DeviceLayout) -> None:
        if self.global_batch_size % layout.world_size:
            raise ValueError(f"global batch size {self.global_batch_size} is not divisible by world size "
                             f"{layout.world_size}; pick a global batch size that every world size you use divides")

    def samples_for(self, t: int, rank: int, world_size: int, ranks_per_node: int | None = None) -> np.ndarray:
        """Sample ids `rank` serves in batch t (counted from this schedule's start)."""
        return self._rank_batches(np.array([self.first_batch + t]), rank, world_size, ranks_per_node)[0]

    def global_batch(self, t: int) -> np.ndarray:
        return self.samples_for(t, 0, 1)

    def _worker_ts(self, layout: DeviceLayout) -> Iterator[np.ndarray]:
        ts = WorkerBatches(self.first_batch, self.total_batches, layout)
        step = max(1, CHUNK_SAMPLES // max(1, self.global_batch_size // layout.world_size))
        for i in range(0, len(ts), step):
            yield np.asarray(ts[i:i + step], dtype=np.int64)

    def worker_batches(self, layout: DeviceLayout) -> Iterator[tuple[int, np.ndarray]]:
        """Lazily yield (t, sample ids) of each rank batch this worker serves (t counted from start)."""
        self.check_layout(layout)
        for ts in self._worker_ts(layout):
            ids = self._rank_batches(ts, layout.rank, layout.world_size, layout.ranks_per_node)
            yield from zip((ts - self.first_batch).tolist(), ids, strict=True)

    def shard_order(self, layout: DeviceLayout, skip_samples: int = 0, renew: int = 0) -> Iterator[ShardNeed]:
        """Each shard this worker will still need, in order of first need (as `BatchSchedule.shard_order`)."""
        self.check_layout(layout)
        chunks = (self._rank_batches(ts, layout.rank, layout.world_size, layout.ranks_per_node, True).reshape(-1)
                  for ts in self._worker_ts(layout))
        return first_needs(chunks, self.plans.run.units.shard_sizes.size, skip_samples, renew=renew)

    def _lookup(self, si: int, pos: np.ndarray, shards: bool) -> np.ndarray:
        plan = self.epoch_plans[si]
        pos = pos % self.lengths[si]
        if shards:
            return plan.shards_at(pos) + self.plans.shard_base[si]
        return plan.samples_at(pos) + self.plans.sample_base[si]


class StratifiedSchedule(StreamSchedule):
    """Global batch t = concat over streams s of S_s[t*g_s : (t+1)*g_s] (positions modulo len(S_s))."""

    def _total_batches(self) -> int:
        self.counts = stratified_counts(self.plans.choose, self.global_batch_size)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        return int(min(n // g for n, g in zip(self.lengths.tolist(), self.counts.tolist(), strict=True)))

    @property
    def padding(self) -> np.ndarray:
        """Per stream: positions served twice in an epoch (wrapped around to the start of S_s)."""
        return np.maximum(0, self.total_batches * self.counts - self.lengths)

    @property
    def dropped(self) -> np.ndarray:
        """Per stream: positions at the end of S_s not served in the epoch."""
        return np.maximum(0, self.lengths - self.total_batches * self.counts)

    def _rank_batches(self, ts: np.ndarray, rank: int, world_size: int, ranks_per_node: int | None,
                      shards: bool = False) -> np.ndarray:
        # The rank's slice of the G concatenated positions: a contiguous split (rank_positions, 1 lane).
        j = rank_positions(0, self.global_batch_size, 1, rank, world_size, ranks_per_node)
        stream = np.searchsorted(self.offsets, j, side="right") - 1
        out = np.empty((ts.size, j.size), dtype=np.int64)
        for si in np.unique(stream).tolist():
            cols = np.flatnonzero(stream == si)
            pos = ts[:, None] * self.counts[si] + (j[cols] - self.offsets[si])[None, :]
            out[:, cols] = self._lookup(si, pos.reshape(-1), shards).reshape(pos.shape)
        return out


class PerStreamSchedule(StreamSchedule):
    """Batch k of stream s is S_s[k*G : (k+1)*G]; streams' batches merged by (k + 0.5) / B_s, see module doc."""

    def _total_batches(self) -> int:
        G = self.global_batch_size
        self.stream_batches = [int(n) // G for n in self.lengths.tolist()]
        return sum(self.stream_batches)

    def _before(self, s: int, k: int) -> list[int]:
        """Per stream r: how many of r's batches come before batch k of stream s in the merge."""
        B = self.stream_batches
        out = []
        for r in range(len(B)):
            if r == s:
                out.append(k)
                continue
            # r's batch j precedes iff (2j+1)/B_r < (2k+1)/B_s, or equal and r < s: odd m = 2j+1 with
            # m*B_s < N (<= N when r < s), N = (2k+1)*B_r.
            n = (2 * k + 1) * B[r]
            m_max = n // B[s] if r < s else (n - 1) // B[s]
            out.append(min(B[r], (m_max + 1) // 2))
        return out

    def locate(self, t: int) -> tuple[int, int]:
        """(stream index, batch of that stream) of absolute batch t of the merge: O(streams^2 log)."""
        if not 0 <= t < self.total_batches:
            raise IndexError(f"batch {t} outside the epoch of {self.total_batches} batches")
        for s, b in enumerate(self.stream_batches):
            lo, hi = 0, b - 1  # the largest k whose merge rank is <= t
            if b == 0 or sum(self._before(s, 0)) > t:
                continue
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if sum(self._before(s, mid)) <= t:
                    lo = mid
                else:
                    hi = mid - 1
            if sum(self._before(s, lo)) == t:
                return s, lo
        raise AssertionError(f"batch {t} not found in the merge")  # pragma: no cover

    def merged(self, t0: int) -> Iterator[tuple[int, int]]:
        """(stream, batch of the stream) of absolute batches t0, t0+1, ... to the end of the epoch."""
        if t0 >= self.total_batches:
            return
        s0, k0 = self.locate(t0)
        counts = self._before(s0, k0)
        B = self.stream_batches
        # Key (2k+1)/(2B_s) exactly, as a Fraction; ties to the lower stream index.
        heap = [(Fraction(2 * c + 1, 2 * B[r]), r, c) for r, c in enumerate(counts) if c < B[r]]
        heapq.heapify(heap)
        while heap:
            _, r, c = heapq.heappop(heap)
            yield r, c
            if c + 1 < B[r]:
                heapq.heappush(heap, (Fraction(2 * c + 3, 2 * B[r]), r, c + 1))

    def _rank_batches(self, ts: np.ndarray, rank: int, world_size: int, ranks_per_node: int | None,
                      shards: bool = False) -> np.ndarray:
        per_rank = self.global_batch_size // world_size
        out = np.empty((ts.size, per_rank), dtype=np.int64)
        if not ts.size:
            return out
        want = ts.tolist()
        sk = np.empty((ts.size, 2), dtype=np.int64)
        i, gen = 0, self.merged(want[0])
        for t in range(want[0], want[-1] + 1):
            pair = next(gen)
            if t == want[i]:
                sk[i] = pair
                i += 1
        for si in np.unique(sk[:, 0]).tolist():
            rows = np.flatnonzero(sk[:, 0] == si)
            lanes = self.epoch_plans[si].num_lanes
            pos = rank_positions(sk[rows, 1] * self.global_batch_size, self.global_batch_size, lanes, rank,
                                 world_size, ranks_per_node)
            out[rows] = self._lookup(si, pos.reshape(-1), shards).reshape(pos.shape)
        return out

    def stream_of(self, t: int) -> int:
        """Contributing-stream index of batch t (counted from this schedule's start)."""
        return self.locate(self.first_batch + t)[0]
