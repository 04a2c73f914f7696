"""Learning-rate schedules as pure functions of a `Timestamp`.

A schedule maps where the run is to a multiplier of the optimizer's base learning rate:

    sched = CosineWithWarmup(warmup="2000ba", duration="1dur", alpha_f=0.1)
    sched = sched.resolve(max_duration="2ep", batches_per_epoch=len(loader))   # `dur`/`ep` -> batches
    sched(timestamp)  # 0.0 at the start, 1.0 after warmup, 0.1 at the end

`warmup` and `duration` are Times in batches, samples or tokens (a token-based schedule follows the
number of tokens seen, whatever the batch size), or `dur` / `ep`, which `resolve` turns into a counting
unit once `max_duration` is known. Warmup and duration must end up in the same unit. `duration` is the
total length of the schedule, warmup included; past it the multiplier stays at its final value.

`lambda_lr(optimizer, schedule, timestamp_fn)` wraps a schedule in a `torch.optim.lr_scheduler.LambdaLR`
that reads the live timestamp each time the scheduler steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tessera.train.time import Time, Timestamp, TimeUnit, resolve_time

if TYPE_CHECKING:
    import torch


def _fraction(elapsed: float, length: float) -> float:
    """elapsed / length clamped to [0, 1]; a zero length is already complete."""
    if length <= 0:
        return 1.0
    return min(max(elapsed / length, 0.0), 1.0)


@dataclass(frozen=True)
class _Schedule:
    warmup: Time | str = "0ba"
    duration: Time | str = "1dur"

    def __post_init__(self) -> None:
        object.__setattr__(self, "warmup", Time.parse(self.warmup))
        object.__setattr__(self, "duration", Time.parse(self.duration))

    def resolve(self, max_duration: Time | str | None = None, *,
                batches_per_epoch: int | None = None) -> _Schedule:
        """A copy with `dur` (and `ep`, given batches_per_epoch) turned into counting units."""
        warmup = resolve_time(self.warmup, max_duration, batches_per_epoch=batches_per_epoch)
        duration = resolve_time(self.duration, max_duration, batches_per_epoch=batches_per_epoch)
        if warmup.value == 0:
            warmup = Time(0, duration.unit)  # no warmup: its unit does not matter
        return replace(self, warmup=warmup, duration=duration)

    def _progress(self, timestamp: Timestamp) -> tuple[float, float]:
        """(warmup fraction, decay fraction), each in [0, 1]."""
        warmup, duration = self.warmup, self.duration
        if TimeUnit.DURATION in (warmup.unit, duration.unit):
            raise ValueError(f"{type(self).__name__}(warmup={warmup}, duration={duration}) uses 'dur'; "
                             f"call .resolve(max_duration) first")
        if warmup.value and warmup.unit is not duration.unit:
            raise ValueError(f"{type(self).__name__}: warmup {warmup} and duration {duration} must use "
                             f"the same unit")
        now = timestamp.get(duration.unit).value
        return (_fraction(now, warmup.value),
                _fraction(now - warmup.value, duration.value - warmup.value))

    def multiplier(self, timestamp: Timestamp) -> float:
        raise NotImplementedError

    def __call__(self, timestamp: Timestamp) -> float:
        """The learning-rate multiplier at `timestamp`."""
        return self.multiplier(timestamp)


@dataclass(frozen=True)
class CosineWithWarmup(_Schedule):
    """Linear warmup from 0 to 1, then half a cosine from 1 down to `alpha_f` at `duration`."""

    alpha_f: float = 0.0

    def multiplier(self, timestamp: Timestamp) -> float:
        warm, decay = self._progress(timestamp)
        if warm < 1.0:
            return warm
        return self.alpha_f + (1.0 - self.alpha_f) * 0.5 * (1.0 + math.cos(math.pi * decay))


@dataclass(frozen=True)
class ConstantWithWarmup(_Schedule):
    """Linear warmup from 0 to 1, then 1 for the rest of the run."""

    def multiplier(self, timestamp: Timestamp) -> float:
        warm, _ = self._progress(timestamp)
        return warm


@dataclass(frozen=True)
class LinearWithWarmup(_Schedule):
    """Linear warmup from 0 to 1, then a straight line from 1 down to `alpha_f` at `duration`.

    With the default `warmup="0ba"` this is plain linear decay.
    """

    alpha_f: float = 0.0

    def multiplier(self, timestamp: Timestamp) -> float:
        warm, decay = self._progress(timestamp)
        if warm < 1.0:
            return warm
        return 1.0 + (self.alpha_f - 1.0) * decay


Schedule = Callable[[Timestamp], float]


def lambda_lr(optimizer: torch.optim.Optimizer, schedule: Schedule,
              timestamp_fn: Callable[[], Timestamp] | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` whose multiplier is `schedule(timestamp_fn())` each time it steps.

    The loop calls `scheduler.step()` after advancing its timestamp. Without `timestamp_fn`, the
    scheduler's own step count stands for the batch count (fine for batch-based schedules only).
    The returned scheduler's state_dict holds only its step count and learning rates, never the
    schedule or the function, so it checkpoints cleanly.
    """
    import torch

    if timestamp_fn is None:
        unit = getattr(schedule, "duration", Time(0, TimeUnit.BATCH)).unit
        if unit in (TimeUnit.EPOCH, TimeUnit.SAMPLE, TimeUnit.TOKEN):
            raise ValueError(f"a schedule measured in {unit.value} needs timestamp_fn (the step count "
                             f"only tells batches)")

    def lr_lambda(step: int) -> float:
        timestamp = timestamp_fn() if timestamp_fn is not None else Timestamp(batch=step)
        return schedule(timestamp)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
