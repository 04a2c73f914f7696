"""`batching_method="device_per_stream"`: every device batch comes from one stream.

MosaicML Streaming's semantics: each per-device batch (``b = batch_size`` samples) holds samples of a
single stream, while the devices of one global batch may each take a different stream (useful when
streams differ in shape, e.g. sequence length). Tessera's version, built on the per-stream sequences S_s
of `stream_batches.StreamPlans` (stream weights and shuffle settings as for the other methods):

1. Stream s is cut into ``D_s = ceil(len(S_s) / b)`` device batches, the k-th being
   ``S_s[k*b : (k+1)*b]``; the last one wraps around to the start of S_s (< b padding per stream), so
   every weighted sample is served (MosaicML drops that partial batch instead).
2. The N = sum D_s device batches of all streams form one **device-batch sequence**, a pure function of
   (data, weights, seed, epoch, b) and nothing else. Its order: the even merge of `PerStreamSchedule`
   (batch k of stream s at (k + 0.5) / D_s, exact, ties to the lower stream) is cut into chunks of
   `CHUNK` device batches, and the streams' device batches inside each chunk are shuffled by a generator
   keyed by (seed, [epoch,] chunk), each stream's batches keeping their order. So streams are spread
   evenly over the epoch (at the scale of `CHUNK`), a device does not always get the same stream (as a
   pure even interleave would do), and a stream is still read front to back (shard locality, prefetch).
   MosaicML shuffles the stream of every device batch over the whole epoch; that would need O(epoch)
   memory or O(epoch) work to resume, which Tessera's plans avoid.
3. With W data-parallel ranks, global batch t is device batches ``t*W .. t*W + W - 1`` of the sequence,
   rank r taking ``t*W + r``. When W does not divide N, the last global batch is completed by filler
   device batches that continue the streams cyclically (filler i: stream i % streams, positions past
   its end wrapping around), so every rank gets the same number of batches.

Resume: ``samples_consumed = (device batches consumed) * b``. Since the sequence does not depend on W, a
resume on another world size continues it exactly (the next global batch is the next W' device batches)
provided the per-device batch size b is the same; a state with another b is refused. Locating device
batch p costs two binary searches of the even merge and one chunk (O(streams^2 log N + CHUNK)), so resume
never walks the epoch and memory stays O(streams + CHUNK).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from tessera.stream.batching.device_layout import DeviceLayout
from tessera.stream.batching.epoch_plan import EpochPlan
from tessera.stream.batching.stream_batches import PerStreamSchedule, StreamPlans, StreamSchedule
from tessera.stream.shuffle import philox

CHUNK = 256  # device batches per chunk of the sequence whose streams are shuffled together
TAG_DEVICE_CHUNK = 10  # seeds of the chunk shuffles (shuffle.py uses tags 1-8, stream_batches.py 9)


class _EvenMerge(PerStreamSchedule):
    """`PerStreamSchedule`'s exact even merge (`_before`, `locate`) over device batches of the streams.

    Only the merge is reused, not the schedule: the merge methods read nothing but `stream_batches` and
    `total_batches`, so the parent's constructor (which needs the global batch size) is not run.
    """

    def __init__(self, stream_batches: list[int]) -> None:  # noqa: D107 - see the class docstring
        self.stream_batches = list(stream_batches)
        self.total_batches = sum(self.stream_batches)

    def counts_at(self, p: int) -> np.ndarray:
        """Per stream: how many of its device batches come before position p of the merge."""
        if p >= self.total_batches:
            return np.array(self.stream_batches, dtype=np.int64)
        return np.array(self._before(*self.locate(p)), dtype=np.int64)


def check_device_batches(choose: list[int], device_batch_size: int) -> None:
    """A stream with fewer weighted samples than one device batch cannot fill one: an error, as in MosaicML."""
    for s, c in enumerate(choose):
        if c < device_batch_size:
            raise ValueError(f"batching_method='device_per_stream': contributing stream {s} gives {c} samples "
                             f"per epoch, fewer than one device batch (batch_size={device_batch_size}); lower "
                             f"batch_size or raise that stream's proportion/repeat/choose")


class DevicePerStreamSchedule(StreamSchedule):
    """Global batches of a device_per_stream epoch from `start` on (see the module docstring).

    `start` (samples consumed over all ranks) need only be a multiple of the device batch size b: with
    another world size than the one that saved it, the resume starts inside the old world's global batch
    grid. Batch indices t count this schedule's global batches from `start`.
    """

    def __init__(self, plans: StreamPlans, epoch_plans: list[EpochPlan], global_batch_size: int, start: int,
                 device_batch_size: int) -> None:
        b, G = int(device_batch_size), int(global_batch_size)
        if b < 1 or G < 1 or G % b:
            raise ValueError(f"global batch size {G} must be a positive multiple of the device batch size {b}")
        self.plans, self.epoch_plans = plans, epoch_plans
        self.device_batch_size, self.global_batch_size, self.world_size = b, G, G // b
        self.lengths = np.array([len(p) for p in epoch_plans], dtype=np.int64)
        for s, n in enumerate(self.lengths.tolist()):
            if n < b:
                check_device_batches([n if i == s else b for i in range(len(self.lengths))], b)
        self.stream_batches = [-(-int(n) // b) for n in self.lengths.tolist()]
        self.merge = _EvenMerge(self.stream_batches)
        self.num_device_batches = N = self.merge.total_batches
        self.epoch_samples = N * b  # before the filler of the last global batch
        if start % b or not 0 <= start <= self.epoch_samples:
            raise ValueError(f"start={start} must be a multiple of the device batch size {b} within the epoch "
                             f"of {self.epoch_samples} samples (device_per_stream resumes at device batches)")
        self.start, self.first_device_batch = int(start), int(start) // b
        self.first_batch = 0  # batch indices are relative to start (see the class docstring)
        self.total_batches = self.num_batches = -(-(N - self.first_device_batch) // self.world_size)
        shuffle, cfg = plans.run.config.shuffle, plans.run.config
        self._key = (cfg.seed, TAG_DEVICE_CHUNK, epoch_plans[0].epoch if shuffle else 0)
        self._chunks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._bound: tuple[int, np.ndarray] = (-1, np.zeros(0, dtype=np.int64))

    def check_layout(self, layout: DeviceLayout) -> None:
        if layout.world_size != self.world_size:
            raise ValueError(f"this device_per_stream schedule is for {self.world_size} ranks (global batch "
                             f"{self.global_batch_size} / device batch {self.device_batch_size}), not "
                             f"{layout.world_size}")

    def _chunk(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(stream, device batch of that stream) of each position of chunk c of the sequence (cached)."""
        hit = self._chunks.get(c)
        if hit is not None:
            return hit
        lo, hi = c * CHUNK, min((c + 1) * CHUNK, self.num_device_batches)
        before = self._bound[1] if self._bound[0] == lo else self.merge.counts_at(lo)
        after = self.merge.counts_at(hi)
        self._bound = (hi, after)  # the next chunk starts where this one ends: one binary search per chunk
        streams = np.repeat(np.arange(len(before), dtype=np.int64), after - before)
        streams = streams[philox(*self._key, c).permutation(streams.size)]
        order = np.argsort(streams, kind="stable")  # a stream's batches keep their order in the chunk
        group_start = np.concatenate([[0], np.cumsum(after - before)[:-1]])
        within = np.empty(streams.size, dtype=np.int64)
        within[order] = np.arange(streams.size) - group_start[streams[order]]
        self._chunks[c] = hit = (streams, before[streams] + within)
        while len(self._chunks) > 8:
            self._chunks.popitem(last=False)
        return hit

    def device_batches(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(stream, device batch of that stream) of absolute positions p of the device-batch sequence."""
        p = np.asarray(p, dtype=np.int64)
        stream, k = np.empty_like(p), np.empty_like(p)
        N, n = self.num_device_batches, len(self.stream_batches)
        real = p < N
        chunk = p // CHUNK
        for c in np.unique(chunk[real]).tolist():
            sel = real & (chunk == c)
            streams, ks = self._chunk(c)
            stream[sel], k[sel] = streams[p[sel] - c * CHUNK], ks[p[sel] - c * CHUNK]
        filler = p[~real] - N  # continue the streams cyclically, past their ends (positions wrap)
        stream[~real] = filler % n
        k[~real] = np.array(self.stream_batches, dtype=np.int64)[filler % n] + filler // n
        return stream, k

    def _rank_batches(self, ts: np.ndarray, rank: int, world_size: int, ranks_per_node: int | None,
                      shards: bool = False) -> np.ndarray:
        if world_size != self.world_size:
            raise ValueError(f"world size {world_size} is not this schedule's {self.world_size}")
        b = self.device_batch_size
        stream, k = self.device_batches(self.first_device_batch + np.asarray(ts, dtype=np.int64) * world_size + rank)
        out = np.empty((stream.size, b), dtype=np.int64)
        for si in np.unique(stream).tolist():
            rows = np.flatnonzero(stream == si)
            pos = k[rows, None] * b + np.arange(b, dtype=np.int64)
            out[rows] = self._lookup(si, pos.reshape(-1), shards).reshape(pos.shape)
        return out

    def global_batch(self, t: int) -> np.ndarray:
        """Sample ids of global batch t: the device batches of ranks 0, 1, ... concatenated."""
        return np.concatenate([self.samples_for(t, r, self.world_size) for r in range(self.world_size)])

    def stream_of(self, t: int, rank: int) -> int:
        """Contributing-stream index of `rank`'s device batch in global batch t (from this schedule's start)."""
        p = self.first_device_batch + t * self.world_size + rank
        return int(self.device_batches(np.array([p]))[0][0])
