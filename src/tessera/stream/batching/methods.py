"""`batching_method`: which schedule cuts an epoch into global batches, and the checks made up front.

"random" is `random_batches.BatchSchedule` over the mixed sequence of `epoch_plan`; "stratified" and
"per_stream" are in `stream_batches`, "device_per_stream" in `device_per_stream`. This module is the
only one that knows them all, so those modules need not import each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from tessera.stream.batching.device_layout import CHUNK_SAMPLES, DeviceLayout
from tessera.stream.batching.device_per_stream import DevicePerStreamSchedule, check_device_batches
from tessera.stream.batching.epoch_plan import RunPlan
from tessera.stream.batching.random_batches import BatchSchedule
from tessera.stream.batching.stream_batches import (
    PerStreamSchedule,
    StratifiedSchedule,
    StreamPlans,
    StreamSchedule,
    stratified_counts,
)

BATCHING_METHODS = ("random", "stratified", "per_stream", "device_per_stream")


def check_batching_method(method: str) -> str:
    """`method`, if it is one of `BATCHING_METHODS` (else ValueError naming them)."""
    if method not in BATCHING_METHODS:
        raise ValueError(f"unknown batching_method {method!r}; use one of {BATCHING_METHODS}")
    return method


def check_batching_settings(method: str, choose: list[int], global_batch_size: int, device_batch_size: int) -> None:
    """Settings a batching method cannot serve raise ValueError at construction, before any download."""
    if method == "stratified":
        stratified_counts(choose, global_batch_size)
    elif method == "device_per_stream":
        check_device_batches(choose, device_batch_size)


def stream_schedule(plans: StreamPlans, method: str, epoch: int, global_batch_size: int, start: int = 0,
                    device_batch_size: int | None = None) -> StreamSchedule:
    """The schedule of a method other than "random" for `epoch`, from `start` samples consumed on."""
    if method == "device_per_stream":
        if device_batch_size is None:
            raise ValueError("batching_method='device_per_stream' needs the device batch size")
        return DevicePerStreamSchedule(plans, plans.epoch(epoch), global_batch_size, start, device_batch_size)
    cls = {"stratified": StratifiedSchedule, "per_stream": PerStreamSchedule}[method]
    return cls(plans, plans.epoch(epoch), global_batch_size, start)


class Batching:
    """A dataset's batching method over its run plan: the schedule of any epoch from any start.

    The per-stream plans of the methods other than "random" are built once per run plan (a resume with
    other lanes or block size makes a new run plan, and so new stream plans).
    """

    def __init__(self, method: str, device_batch_size: int) -> None:
        self.method = check_batching_method(method)
        self.device_batch_size = device_batch_size
        self._plans: StreamPlans | None = None

    def forget_plans(self) -> None:
        """Drop the per-stream plans (rebuilt from the run plan when next needed)."""
        self._plans = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_plans": None}  # rebuilt from the run plan in the process that needs them

    def schedule(self, run: RunPlan, epoch: int, global_batch_size: int,
                 start: int = 0) -> BatchSchedule | StreamSchedule:
        if self.method == "random":
            return BatchSchedule(run.epoch(epoch), global_batch_size, start)
        return self._per_stream(run, epoch, global_batch_size, start)

    def epoch_samples(self, run: RunPlan, epoch: int, global_batch_size: int) -> int:
        """Positions served in an epoch before the wrap-around of its last global batch."""
        if self.method == "random":
            return len(run.epoch(epoch))
        return self._per_stream(run, epoch, global_batch_size, 0).epoch_samples

    def _per_stream(self, run: RunPlan, epoch: int, global_batch_size: int, start: int) -> StreamSchedule:
        if self._plans is None or self._plans.run is not run:
            self._plans = StreamPlans(run)
        return stream_schedule(self._plans, self.method, epoch, global_batch_size, start, self.device_batch_size)


def reader_batches(sched: BatchSchedule | StreamSchedule, layout: DeviceLayout,
                   locate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
                   ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`locate`(sample ids) of each rank batch `layout`'s reader serves, in order (for a dataset: shard
    ids and in-shard indices); the last one may be partial (`BatchSchedule.rank_batch_positions`).
    Computed a chunk of batches at a time (numpy calls per batch cost more than the math)."""
    if isinstance(sched, StreamSchedule):
        yield from (locate(ids) for _, ids in sched.worker_batches(layout))
        return
    G = sched.global_batch_size
    ts_all = sched.worker_batch_indices(layout)
    most, i, step = max(1, CHUNK_SAMPLES // max(1, G // layout.world_size)), 0, 1
    while i < len(ts_all):  # chunks of 1, 2, 4, ... batches: the first batch waits for one batch's plan
        ts = np.asarray(ts_all[i:i + step], dtype=np.int64)
        i, step = i + len(ts), min(2 * step, most)
        pos = sched.rank_batch_positions(ts, layout)
        short = pos[-1] < 0  # only the epoch's last batch can be partial
        shards, local = locate(sched.plan.samples_at(np.where(pos < 0, 0, pos).reshape(-1)))
        shards, local = shards.reshape(pos.shape), local.reshape(pos.shape)
        yield from zip(shards[:-1], local[:-1], strict=True)
        if not short.all():
            yield shards[-1][~short], local[-1][~short]
