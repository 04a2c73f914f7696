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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

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
            raise ValueError(f"Invalid sampling method: {self.sampling_method!r}; sampling_method is one of {SAMPLING_METHODS}")

    @property
    def algo(self) -> str:
        return SHUFFLE_ALGO_ALIASES.get(self.shuffle_algo, self.shuffle_algo)

    @property
    def block_size(self) -> int:
        if self.shuffle_block_size is not None:
            return int(self.shuffle_block_size)
        return max(4_000_000 // self.num_lanes, 1 << 18)


class PlanStore(Protocol):
    """Where built plan arrays are kept, so that other processes of the node map them instead of building
    their own (the stream layer's files: stream/plan_files.py); without one, each process builds."""

    def get_or_build(self, name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]: ...


class RunPlan:
    """Run-fixed part of the plan: weights resolved into units and their lane assignment order."""

    def __init__(self, streams: Sequence[StreamShards], config: PlanConfig, store: PlanStore | None = None):
        self.config = config
        self.streams = tuple(streams)
        self.store = store
        choose = resolve_choose(self.streams, config.epoch_size, config.seed)
        self.units = UnitTable(self.streams, choose, config.seed, config.sampling_method)
        self.fingerprint = self._fingerprint()

    @property
    def unit_order(self) -> np.ndarray:
        """The units in run order (a permutation when shuffled), made when an epoch's lanes are built
        (int32 below 2**31 units; a process that maps built lanes never makes it)."""
        order = self.__dict__.get("_unit_order")
        if order is None:
            count = self.units.num_units
            dtype = np.int32 if count < 2**31 else np.int64
            order = (philox(self.config.seed, TAG_RUN_UNITS).permutation(count).astype(dtype) if self.config.shuffle
                     else np.arange(count, dtype=dtype))
            self.__dict__["_unit_order"] = order
        return order

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

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_unit_order", "_last_epoch")}


class EpochPlan:
    """One epoch's global sequence S, computed lazily from O(units + lanes) arrays.

    The pieces of each lane (step 2) are built when a position of the lane is first asked for, from the
    run order and a table of where lanes cut it (`cuts`: per lane its first unit in run order, that
    unit's first sample in the run-ordered sequence, and the unit after its last). A lane's pieces are its
    units in their per-epoch order (`units`), their first positions (`starts`) and the offset into its
    first unit at which the lane begins (one piece per lane starts inside a unit). A reader therefore holds
    the lanes it reads (the lanes of its node when nodes divide the lanes: `rank_positions`), and with a
    `PlanStore` the node's processes map the lanes and the table one of them built.
    """

    def __init__(self, run: RunPlan, epoch: int):
        if int(epoch) != epoch or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        self.run, self.epoch = run, int(epoch)
        cfg, units = run.config, run.units
        self.seed, self.num_lanes, self.shuffle = cfg.seed, cfg.num_lanes, cfg.shuffle
        lanes = self.num_lanes
        self.unit_sizes = units.unit_sizes(self.epoch)
        self.size = int(self.unit_sizes.sum())
        if self.size < lanes:
            raise ValueError(f"the epoch has {self.size} samples, fewer than num_lanes={lanes}; "
                             "lower num_lanes (num_canonical_nodes)")
        self.lane_start = np.arange(lanes + 1, dtype=np.int64) * self.size // lanes
        self.lane_size = np.diff(self.lane_start)
        self.lane_length = -(-self.size // lanes)
        self.padding = lanes * self.lane_length - self.size
        self.block_size = self.lane_length if cfg.algo == "naive" else min(cfg.block_size, self.lane_length)
        if self.shuffle:
            self.stagger = (hash_words(derive_key(self.seed, TAG_STAGGER, self.epoch), np.arange(lanes))
                            % np.uint64(self.block_size)).astype(np.int64)
            if cfg.algo == "naive":
                self.stagger[:] = 0
            self._unit_key = derive_key(self.seed, TAG_UNIT_ORDER, self.epoch)
            self._block_key = derive_key(self.seed, TAG_BLOCK, self.epoch)
        self.cuts = self._stored(f"e{self.epoch}.cuts", lambda: {"cuts": self._cut_table()})["cuts"]
        self._lanes: dict[int, dict[str, np.ndarray]] = {}

    def _stored(self, name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        store = self.run.store
        return build() if store is None else store.get_or_build(name, build)

    def _cut_table(self) -> np.ndarray:
        """Step 1: int64 (lanes, 3): each lane's first unit in run order, that unit's first position in
        the run-ordered sequence, and the first unit starting at or after the lane's end."""
        order = self.run.unit_order
        bounds = np.empty(order.size + 1, np.int64)
        bounds[0] = 0
        np.cumsum(self.unit_sizes[order], out=bounds[1:])
        first = np.searchsorted(bounds, self.lane_start[:-1], side="right") - 1
        return np.stack([first, bounds[first], np.searchsorted(bounds, self.lane_start[1:], side="left")], axis=1)

    def lane(self, lane: int) -> dict[str, np.ndarray]:
        """Steps 1-2 for one lane: its pieces (see the class docstring), built once."""
        found = self._lanes.get(lane)
        if found is None:
            found = self._lanes[lane] = self._stored(f"e{self.epoch}.lane{lane}", lambda: self._lane_pieces(lane))
        return found

    def _lane_pieces(self, lane: int) -> dict[str, np.ndarray]:
        """(A store keeps these arrays in files: a change of what they mean needs plan_files.MAGIC changed.)"""
        first, base, end = (int(v) for v in self.cuts[lane])
        lo, hi = int(self.lane_start[lane]), int(self.lane_start[lane + 1])
        units = self.run.unit_order[first:end]
        lengths = self.unit_sizes[units]  # (a new array) cut to the lane at both ends
        lengths[0] = min(base + lengths[0], hi) - lo
        if lengths.size > 1:
            lengths[-1] = min(lengths[-1], hi - lo - int(lengths[:-1].sum()))
        keep = lengths > 0  # (units with no samples this epoch; the first piece is never empty)
        if not keep.all():
            units, lengths = units[keep], lengths[keep]
        at = 0  # where the piece starting inside its unit (at lo - base) is
        if self.shuffle:  # Step 2: the lane's pieces reordered by a generator keyed by (seed, epoch, lane)
            perm = philox(self.seed, TAG_LANE_ORDER, self.epoch, lane).permutation(units.size)
            units, lengths, at = units[perm], lengths[perm], int(np.argmin(perm))
        else:
            units = units.copy()
        starts = np.empty(units.size, np.int64)
        starts[0] = lo
        np.cumsum(lengths[:-1], out=starts[1:])
        starts[1:] += lo
        return {"units": units, "starts": starts, "offset": np.array([at, lo - base], np.int64)}

    def __len__(self) -> int:
        """Length of S: the weighted epoch plus padding."""
        return self.size + self.padding

    @property
    def nbytes(self) -> int:
        """Memory held by the plan's arrays (run-fixed, per epoch and the lanes built so far)."""
        arrays = [self.cuts, self.lane_start, self.lane_size, *(a for p in self._lanes.values() for a in p.values())]
        u = self.run.units
        arrays += [a for a in (self.run.__dict__.get("_unit_order"), u.unit_shard, u.unit_partial) if a is not None]
        if u.unit_shard is not None:
            arrays += [self.unit_sizes, u.shard_sizes, u.shard_base, u._partial_shard_units]
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
        units = np.empty(g.shape, np.int64)
        offsets = np.empty(g.shape, np.int64)
        for each in np.unique(lane).tolist():
            mine = lane == each if self.num_lanes > 1 else slice(None)
            pieces = self.lane(each)
            i = np.searchsorted(pieces["starts"], x[mine], side="right") - 1
            at, offset = pieces["offset"]
            units[mine] = pieces["units"][i]
            offsets[mine] = x[mine] - pieces["starts"][i] + np.where(i == at, offset, 0)
        return units, offsets

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
        out = u.shard_base[u.shard_of(units)] + index
        return out.reshape(np.shape(positions))

    def shards_at(self, positions: np.ndarray | Sequence[int]) -> np.ndarray:
        """Shard ids (numbered across streams) of the samples at `positions` of S."""
        units, _ = self._pieces_at(np.asarray(positions, dtype=np.int64).reshape(-1))
        return self.run.units.shard_of(units).reshape(np.shape(positions))

    def sample_at(self, position: int) -> int:
        """Global sample id at one position (O(log units), but ~0.5 ms of numpy overhead: batch calls)."""
        return int(self.samples_at(np.array([position]))[0])
