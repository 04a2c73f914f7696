"""The epoch plan: which sample goes where and when. Pure functions of the inputs; no I/O, no torch.

For fixed (dataset content, stream weights, seed, epoch, lanes, block size) an epoch is one global sample
sequence S. **Global batch t is S[start + t*G : start + (t+1)*G]** for global batch size G, whatever the
layout; `start` is the number of samples already consumed in the epoch (0 for a fresh epoch). Nothing of
size O(epoch) is ever built: every position of S is computed on demand from O(units) arrays.

How S is built (`RunPlan` does step 1, `EpochPlan` steps 2-4, `device_layout.rank_positions` step 5):

1. Run-fixed: the stream-weighted units (`mixing.UnitTable`) are permuted by a key of the seed and laid end
   to end; the sequence is cut into L lanes at ``l*T//L``, splitting a unit at a cut. Lanes hold
   ``floor(T/L)`` or ``ceil(T/L)`` samples.
2. Per epoch: the unit pieces inside each lane are reordered by keys of (seed, epoch, lane, piece).
3. Per epoch: lane position p falls in block ``k = (p + stagger[lane]) // B`` (stagger is keyed by
   (seed, epoch, lane), so block edges differ between lanes); the block is shuffled by the keyed bijection
   of (seed, epoch, lane, k) from `shuffle.feistel_permute`, which needs no cache and no O(B) memory. The
   samples of one unit are also visited in a keyed per-epoch order, so two epochs never pair the same
   samples in a block. ``shuffle_algo="naive"`` makes the block the whole lane.
4. S[g] is lane ``g % L`` at lane position ``g // L``.
5. The positions of a global batch go to ranks by lane when possible (see `rank_positions`).

Padding: lanes are all ``M = ceil(T/L)`` long, so the ``L*M - T < L`` short lanes repeat, at their last
position, the sample at their first position. `EpochPlan.padding` counts them; they sit at the very end of
S. Every weighted sample appears in S exactly once more.

``shuffle=False`` keeps the units in stream/shard order and the samples of a unit in index order (a
partial unit in keyed subset order), still cut into interleaved lanes, as in MosaicML Streaming.

The plan is the sequence only: `random_batches.BatchSchedule` cuts it into global batches, and
`resume_state` saves and checks where a run stopped in it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tessera.stream.batching.mixing import SAMPLING_METHODS, StreamShards, UnitTable, resolve_choose
from tessera.stream.shuffle import (
    TAG_BLOCK,
    TAG_LANE_ORDER,
    TAG_RUN_UNITS,
    TAG_STAGGER,
    TAG_UNIT_ORDER,
    derive_key,
    feistel_permute,
    hash_words,
    philox,
)

PLAN_VERSION = 1
SHUFFLE_ALGOS = ("block", "naive")
# MosaicML's algorithm names are accepted so configs carry over; all of them run our block shuffle.
SHUFFLE_ALGO_ALIASES = {"py1e": "block", "py1br": "block", "py1s": "block", "py2s": "block"}


@dataclass(frozen=True)
class PlanConfig:
    """Settings that define S, with MosaicML Streaming's meaning (`num_lanes` = `num_canonical_nodes`)."""

    seed: int = 9176
    num_lanes: int = 1
    shuffle: bool = False
    shuffle_algo: str = "block"
    shuffle_block_size: int | None = None  # None: max(4_000_000 // num_lanes, 2**18), as MosaicML
    epoch_size: int | None = None
    sampling_method: str = "balanced"
    dataset_fingerprint: str = ""  # content hash of the dataset index, folded into the plan fingerprint

    def __post_init__(self) -> None:
        if int(self.seed) != self.seed or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if int(self.num_lanes) != self.num_lanes or self.num_lanes < 1:
            raise ValueError(f"num_lanes (num_canonical_nodes) must be an integer >= 1, got {self.num_lanes!r}")
        if self.shuffle_block_size is not None and (int(self.shuffle_block_size) != self.shuffle_block_size
                                                    or self.shuffle_block_size < 1):
            raise ValueError(f"shuffle_block_size must be an integer >= 1, got {self.shuffle_block_size!r}")
        algo = SHUFFLE_ALGO_ALIASES.get(self.shuffle_algo, self.shuffle_algo)
        if algo not in SHUFFLE_ALGOS:
            raise ValueError(f"unknown shuffle_algo {self.shuffle_algo!r}; use one of "
                             f"{SHUFFLE_ALGOS + tuple(SHUFFLE_ALGO_ALIASES)}")
        if self.sampling_method not in SAMPLING_METHODS:
            raise ValueError(f"sampling_method must be one of {SAMPLING_METHODS}, got {self.sampling_method!r}")

    @property
    def algo(self) -> str:
        return SHUFFLE_ALGO_ALIASES.get(self.shuffle_algo, self.shuffle_algo)

    @property
    def block_size(self) -> int:
        if self.shuffle_block_size is not None:
            return int(self.shuffle_block_size)
        return max(4_000_000 // self.num_lanes, 1 << 18)


class RunPlan:
    """Run-fixed part of the plan: weights resolved into units and their lane assignment order."""

    def __init__(self, streams: Sequence[StreamShards], config: PlanConfig):
        self.config = config
        self.streams = tuple(streams)
        choose = resolve_choose(self.streams, config.epoch_size, config.seed)
        self.units = UnitTable(self.streams, choose, config.seed, config.sampling_method)
        count = self.units.num_units
        self.unit_order = (philox(config.seed, TAG_RUN_UNITS).permutation(count) if config.shuffle
                           else np.arange(count, dtype=np.int64))
        self.fingerprint = self._fingerprint()

    def _fingerprint(self) -> str:
        h = hashlib.sha256()
        c = self.config
        h.update(json.dumps([PLAN_VERSION, c.dataset_fingerprint, c.seed, c.num_lanes, c.shuffle, c.algo,
                             c.block_size, c.epoch_size, c.sampling_method]).encode())
        for s in self.streams:
            granularity = [s.granularity] if s.granularity != 1 else []  # (1 keeps older fingerprints)
            h.update(json.dumps([s.proportion, s.repeat, s.choose, int(s.sizes.size), *granularity]).encode())
            h.update(np.ascontiguousarray(s.sizes, dtype="<i8").tobytes())
        return h.hexdigest()[:32]

    def epoch(self, epoch: int) -> EpochPlan:
        """One epoch's plan. The last one is kept: it is immutable, costs a few ms to build (more with
        many shards) and is asked for several times per epoch (len(), the resume state, the schedule),
        which was most of the time a resumed reader took to its first batch."""
        last = self.__dict__.get("_last_epoch")
        if last is not None and last.epoch == epoch:
            return last
        plan = self.__dict__["_last_epoch"] = EpochPlan(self, epoch)
        return plan


class EpochPlan:
    """One epoch's global sequence S, computed lazily from O(units + lanes) arrays."""

    def __init__(self, run: RunPlan, epoch: int):
        if int(epoch) != epoch or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        self.run, self.epoch = run, int(epoch)
        cfg, units = run.config, run.units
        self.seed, self.num_lanes, self.shuffle = cfg.seed, cfg.num_lanes, cfg.shuffle
        lanes = self.num_lanes
        self.unit_sizes = units.unit_sizes(self.epoch)
        order = run.unit_order
        bounds = np.concatenate([[0], np.cumsum(self.unit_sizes[order])])
        self.size = int(bounds[-1])
        if self.size < lanes:
            raise ValueError(f"the epoch has {self.size} samples, fewer than num_lanes={lanes}; "
                             "lower num_lanes (num_canonical_nodes)")
        self.lane_start = np.arange(lanes + 1, dtype=np.int64) * self.size // lanes
        self.lane_size = np.diff(self.lane_start)
        self.lane_length = -(-self.size // lanes)
        self.padding = lanes * self.lane_length - self.size
        self.block_size = self.lane_length if cfg.algo == "naive" else min(cfg.block_size, self.lane_length)
        # Step 1: cut the run-ordered units at lane boundaries into pieces (unit, offset, length).
        cuts = np.insert(bounds, np.searchsorted(bounds, self.lane_start), self.lane_start)
        starts, lengths = cuts[:-1], np.diff(cuts)
        starts, lengths = starts[lengths > 0], lengths[lengths > 0]
        at = np.searchsorted(bounds, starts, side="right") - 1
        piece_unit, piece_offset = order[at], starts - bounds[at]
        if self.shuffle:
            # Step 2: reorder the pieces inside each lane with a generator keyed by (seed, epoch, lane).
            piece_lane = np.searchsorted(self.lane_start, starts, side="right") - 1
            first = np.searchsorted(piece_lane, np.arange(lanes + 1))
            perm = np.empty(starts.size, dtype=np.int64)
            for lane in range(lanes):
                lo, hi = first[lane], first[lane + 1]
                perm[lo:hi] = lo + philox(self.seed, TAG_LANE_ORDER, self.epoch, lane).permutation(hi - lo)
            piece_unit, piece_offset, lengths = piece_unit[perm], piece_offset[perm], lengths[perm]
            self.stagger = (hash_words(derive_key(self.seed, TAG_STAGGER, self.epoch), np.arange(lanes))
                            % np.uint64(self.block_size)).astype(np.int64)
            if cfg.algo == "naive":
                self.stagger[:] = 0
            self._unit_key = derive_key(self.seed, TAG_UNIT_ORDER, self.epoch)
            self._block_key = derive_key(self.seed, TAG_BLOCK, self.epoch)
        self.piece_start = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.piece_unit, self.piece_offset = piece_unit, piece_offset

    def __len__(self) -> int:
        """Length of S: the weighted epoch plus padding."""
        return self.size + self.padding

    @property
    def nbytes(self) -> int:
        """Memory held by the plan's arrays (run-fixed and per-epoch)."""
        arrays = [self.unit_sizes, self.piece_start, self.piece_unit, self.piece_offset, self.lane_start,
                  self.lane_size, self.run.unit_order]
        u = self.run.units
        arrays += [u.shard_sizes, u.shard_base, u.unit_shard, u.unit_partial, u._partial_shard_units]
        return int(sum(a.nbytes for a in arrays))

    def _pieces_at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(unit, offset in the unit's ordered samples) of each position of S."""
        g = np.asarray(positions, dtype=np.int64)
        if g.size and (g.min() < 0 or g.max() >= len(self)):
            raise IndexError(f"positions must lie in [0, {len(self)})")
        lane, p = g % self.num_lanes, g // self.num_lanes
        real = self.lane_size[lane]
        p = np.where(p >= real, p - real, p)  # padding repeats the lane's first positions
        if self.shuffle:
            p = self._block_shuffle(lane, p, real)
        x = self.lane_start[lane] + p
        i = np.searchsorted(self.piece_start, x, side="right") - 1
        return self.piece_unit[i], self.piece_offset[i] + (x - self.piece_start[i])

    def _block_shuffle(self, lane: np.ndarray, p: np.ndarray, real: np.ndarray) -> np.ndarray:
        """Step 3: lane positions -> pre-shuffle lane positions, through the keyed block permutations.

        Nominal block edges are ``k*B - stagger``; a first or last block shorter than B/2 is merged into
        its neighbour, so every block but that of a lane shorter than B/2 holds between B/2 and 1.5*B
        samples and no lane edge leaves a poorly mixed stub.
        """
        b, o = self.block_size, self.stagger[lane]
        last = (real - 1 + o) // b
        merge_first = (2 * (b - o) < b) & (last >= 1)
        lo = merge_first.astype(np.int64)
        merge_last = (2 * (real - (last * b - o)) < b) & (last - 1 >= lo)
        hi = np.where(merge_last, last - 1, last)
        k = np.clip((p + o) // b, lo, hi)
        start = np.where(k == lo, 0, k * b - o)
        end = np.where(k == hi, real, (k + 1) * b - o)
        key = hash_words(self._block_key, lane, k)
        return start + feistel_permute(p - start, end - start, key)

    def samples_at(self, positions: np.ndarray | Sequence[int]) -> np.ndarray:
        """Global sample ids at `positions` of S (vectorised; O(log units) each)."""
        units, offsets = self._pieces_at(np.asarray(positions, dtype=np.int64).reshape(-1))
        if self.shuffle and units.size:
            offsets = feistel_permute(offsets, self.unit_sizes[units], hash_words(self._unit_key, units))
        u = self.run.units
        index = u.sample_in_shard(units, offsets, self.epoch)
        out = u.shard_base[u.unit_shard[units]] + index
        return out.reshape(np.shape(positions))

    def shards_at(self, positions: np.ndarray | Sequence[int]) -> np.ndarray:
        """Shard ids (numbered across streams) of the samples at `positions` of S."""
        units, _ = self._pieces_at(np.asarray(positions, dtype=np.int64).reshape(-1))
        return self.run.units.unit_shard[units].reshape(np.shape(positions))

    def sample_at(self, position: int) -> int:
        """Global sample id at one position (O(log units), but ~0.5 ms of numpy overhead: batch calls)."""
        return int(self.samples_at(np.array([position]))[0])
