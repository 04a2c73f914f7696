"""Training time: units, amounts of time, and where a run is.

`Time` is an amount in one unit: batches (`ba`), epochs (`ep`), samples (`sp`), tokens (`tok`) or a
fraction of the whole run (`dur`). Strings such as "500ba", "2ep", "1e9tok", "0.1dur" and "1_000sp"
parse into it. Counting units hold whole numbers; `dur` holds a float.

`Timestamp` is where a run is: global counters and counters within the current epoch. It is immutable;
`to_next_batch` and `to_next_epoch` return the next one, so a timestamp handed to a checkpoint or a
logger never changes underneath it.

`interval_fires(interval, before, after)` answers "does a save/eval/log interval fire now?" as a pure
function of two consecutive timestamps: it fires when the counter of the interval's unit crosses a
multiple of the interval. `resolve_time` turns `dur` (and, given the epoch length, `ep`) into a counting
unit, given the run's `max_duration`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from numbers import Real
from typing import Any


class TimeUnit(StrEnum):
    """The unit of a `Time`; the value is the suffix used in time strings."""

    BATCH = "ba"
    EPOCH = "ep"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"


_UNIT_NAMES = {TimeUnit.BATCH: "batches", TimeUnit.EPOCH: "epochs", TimeUnit.SAMPLE: "samples",
               TimeUnit.TOKEN: "tokens", TimeUnit.DURATION: "fraction of the run"}
_UNITS_HELP = "ba (batches), ep (epochs), sp (samples), tok (tokens), dur (fraction of the run)"
# Longest suffix first, so "tok" is never read as a number followed by "ok".
_TIME_RE = re.compile(r"^\s*(?P<number>[0-9_.eE+-]+)\s*(?P<unit>tok|dur|ba|ep|sp)\s*$")


_NUMBER_RE = re.compile(r"^\s*[0-9_.eE+-]+\s*$")


def _unit_hint(number: object) -> str:
    """A bare number is almost always meant as batches (YAML reads `save_interval: 20` as an int)."""
    return f"; did you mean '{number}ba' (batches)? Other units: {_UNITS_HELP}"


def _unit(unit: TimeUnit | str) -> TimeUnit:
    try:
        return TimeUnit(unit)
    except ValueError:
        raise ValueError(f"unknown time unit {unit!r}; use one of {_UNITS_HELP}") from None


@dataclass(frozen=True)
class Time:
    """An amount of training time in one unit: `Time(500, "ba")`, `Time.parse("0.1dur")`.

    Ordering and arithmetic (`+`, `-`, `*`/`/` by a number, `Time / Time` -> float) work within one
    unit; mixing units raises TypeError, because "500ba < 2ep" depends on the dataset. Equality is
    structural (`Time(1, "ba") != Time(1, "ep")`), so times can be dict keys. Strings are accepted
    wherever a Time is (`Time(5, "ba") < "6ba"`).
    """

    value: int | float
    unit: TimeUnit

    def __init__(self, value: int | float, unit: TimeUnit | str) -> None:
        unit = _unit(unit)
        if isinstance(value, bool) or not isinstance(value, Real):
            raise TypeError(f"time value must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"time value must be finite, got {value!r} ({unit.value})")
        if unit is TimeUnit.DURATION:
            value = float(value)
        else:
            if value != int(value):
                raise ValueError(f"{value!r}{unit}: {_UNIT_NAMES[unit]} must be a whole number "
                                 f"(use 'dur' for a fraction of the run)")
            value = int(value)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "unit", unit)

    @classmethod
    def parse(cls, text: str | Time) -> Time:
        """Parse "500ba", "2ep", "1e9tok", "0.1dur", "1_000sp"; a Time is returned as is.

        Raises ValueError naming the string for an unknown unit, a bad number, a negative amount, or
        a fraction of a counting unit ("1.5ba").
        """
        if isinstance(text, Time):
            return text
        if not isinstance(text, str):
            hint = _unit_hint(text) if isinstance(text, Real) and not isinstance(text, bool) else ""
            raise TypeError(f"expected a time string such as '500ba', got {text!r}{hint}")
        match = _TIME_RE.match(text)
        if match is None:
            if _NUMBER_RE.match(text):
                raise ValueError(f"cannot parse time {text!r}: it has no unit{_unit_hint(text.strip())}")
            raise ValueError(f"cannot parse time {text!r}: expected a number followed by one of "
                             f"{_UNITS_HELP}, e.g. '500ba', '2ep', '1e9tok', '0.1dur'")
        number = match["number"]
        try:
            value = float(number) if any(c in number for c in ".eE") else int(number)
        except ValueError:
            raise ValueError(f"cannot parse time {text!r}: {number!r} is not a number") from None
        if value < 0:
            raise ValueError(f"cannot parse time {text!r}: a time must not be negative")
        try:
            return cls(value, match["unit"])
        except ValueError as exc:
            raise ValueError(f"cannot parse time {text!r}: {exc}") from None

    # -- arithmetic and ordering within one unit ---------------------------------------------------

    def _same_unit(self, other: object, op: str) -> Time:
        if isinstance(other, str):
            other = Time.parse(other)
        if not isinstance(other, Time):
            raise TypeError(f"cannot apply {op!r} to {self} and {other!r}")
        if other.unit is not self.unit:
            raise TypeError(f"cannot apply {op!r} to {self} and {other}: units differ "
                            f"({self.unit.value} vs {other.unit.value}); convert one first")
        return other

    def __lt__(self, other: Time | str) -> bool:
        return self.value < self._same_unit(other, "<").value

    def __le__(self, other: Time | str) -> bool:
        return self.value <= self._same_unit(other, "<=").value

    def __gt__(self, other: Time | str) -> bool:
        return self.value > self._same_unit(other, ">").value

    def __ge__(self, other: Time | str) -> bool:
        return self.value >= self._same_unit(other, ">=").value

    def __add__(self, other: Time | str) -> Time:
        return Time(self.value + self._same_unit(other, "+").value, self.unit)

    def __radd__(self, other: Time | str) -> Time:
        return self + other

    def __sub__(self, other: Time | str) -> Time:
        return Time(self.value - self._same_unit(other, "-").value, self.unit)

    def __rsub__(self, other: Time | str) -> Time:
        return Time(self._same_unit(other, "-").value - self.value, self.unit)

    def __mul__(self, factor: float) -> Time:
        if isinstance(factor, bool) or not isinstance(factor, Real):
            return NotImplemented
        return Time(self.value * factor, self.unit)

    __rmul__ = __mul__

    def __truediv__(self, other: Time | str | float) -> Any:
        """`Time / Time` (same unit) is a float ratio; `Time / number` is a Time."""
        if isinstance(other, (Time, str)):
            denominator = self._same_unit(other, "/").value
            return self.value / denominator
        if isinstance(other, bool) or not isinstance(other, Real):
            return NotImplemented
        return Time(self.value / other, self.unit)

    def __str__(self) -> str:
        return f"{self.value}{self.unit.value}"

    def __repr__(self) -> str:
        return f"Time({self.value!r}, {self.unit.value!r})"


def to_time(value: Time | str) -> Time:
    """`Time.parse` under a name that reads well at call sites taking "Time or string"."""
    return Time.parse(value)


@dataclass(frozen=True)
class Timestamp:
    """Where a run is: counts since the start, and counts within the current epoch.

    Immutable; the loop does `ts = ts.to_next_batch(samples, tokens)` after every optimizer step and
    `ts = ts.to_next_epoch()` when the dataloader is exhausted.
    """

    epoch: int = 0
    batch: int = 0
    sample: int = 0
    token: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    token_in_epoch: int = 0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Timestamp.{name} must be a non-negative int, got {value!r}")

    def get(self, unit: TimeUnit | str) -> Time:
        """The global count in `unit` as a Time; `dur` needs max_duration, see `fraction_of`."""
        unit = _unit(unit)
        if unit is TimeUnit.DURATION:
            raise ValueError("a Timestamp has no 'dur' count by itself; use "
                             "timestamp.fraction_of(max_duration)")
        count = {TimeUnit.BATCH: self.batch, TimeUnit.EPOCH: self.epoch, TimeUnit.SAMPLE: self.sample,
                 TimeUnit.TOKEN: self.token}[unit]
        return Time(count, unit)

    def fraction_of(self, max_duration: Time | str) -> float:
        """How much of a run of length `max_duration` has elapsed (may exceed 1.0)."""
        total = Time.parse(max_duration)
        if total.unit is TimeUnit.DURATION:
            raise ValueError(f"max_duration must be in ba, ep, sp or tok, not {total}")
        if total.value == 0:
            return 1.0
        return self.get(total.unit).value / total.value

    def to_next_batch(self, samples: int, tokens: int = 0) -> Timestamp:
        """The timestamp after one more batch of `samples` samples and `tokens` tokens."""
        if samples < 0 or tokens < 0:
            raise ValueError(f"a batch cannot hold a negative count (samples={samples}, tokens={tokens})")
        return replace(self, batch=self.batch + 1, sample=self.sample + samples, token=self.token + tokens,
                       batch_in_epoch=self.batch_in_epoch + 1,
                       sample_in_epoch=self.sample_in_epoch + samples,
                       token_in_epoch=self.token_in_epoch + tokens)

    def to_next_epoch(self) -> Timestamp:
        """The timestamp at the start of the next epoch (in-epoch counters reset to 0)."""
        return replace(self, epoch=self.epoch + 1, batch_in_epoch=0, sample_in_epoch=0, token_in_epoch=0)

    def state_dict(self) -> dict[str, int]:
        """Plain ints, JSON-ready."""
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, int]) -> Timestamp:
        """The inverse of `state_dict` (Timestamp is immutable, so loading returns a new one)."""
        known = {name: int(state[name]) for name in cls.__dataclass_fields__ if name in state}
        return cls(**known)


def resolve_time(time: Time | str, max_duration: Time | str | None = None, *,
                 batches_per_epoch: int | None = None) -> Time:
    """Express `time` in a counting unit: `dur` becomes a share of `max_duration`, and `ep` becomes
    batches when `batches_per_epoch` is known. Counting results are rounded to the nearest whole number.

    `resolve_time("0.1dur", "1000ba") == Time(100, "ba")`; `resolve_time("0.5dur", "2ep") == Time(1, "ep")`;
    `resolve_time("0.25dur", "2ep")` needs `batches_per_epoch` (it is half an epoch).
    """
    time = Time.parse(time)
    if time.unit is TimeUnit.DURATION:
        if max_duration is None:
            raise ValueError(f"{time} is a fraction of the run; pass max_duration to resolve it")
        total = Time.parse(max_duration)
        if total.unit is TimeUnit.DURATION:
            raise ValueError(f"max_duration must be in ba, ep, sp or tok, not {total}")
        amount = time.value * total.value
        if total.unit is TimeUnit.EPOCH:
            if batches_per_epoch is not None:
                return Time(round(amount * batches_per_epoch), TimeUnit.BATCH)
            if amount != round(amount):
                raise ValueError(f"{time} of {total} is {amount:g} epochs, not a whole number; pass "
                                 f"batches_per_epoch to resolve it in batches")
        return Time(round(amount), total.unit)
    if time.unit is TimeUnit.EPOCH and batches_per_epoch is not None:
        return Time(time.value * batches_per_epoch, TimeUnit.BATCH)
    return time


def run_progress(timestamp: Timestamp, max_duration: Time, batches_per_epoch: int | None = None) -> float:
    """How much of a run of `max_duration` has elapsed; in epochs, the batches of the current epoch count
    too when its length is known (the progress bar's start and `time/progress`)."""
    if max_duration.unit is TimeUnit.EPOCH and batches_per_epoch and max_duration.value:
        return (timestamp.epoch + timestamp.batch_in_epoch / batches_per_epoch) / max_duration.value
    return timestamp.fraction_of(max_duration)


def interval_fires(interval: Time | str, before: Timestamp, after: Timestamp, *,
                   max_duration: Time | str | None = None, batches_per_epoch: int | None = None) -> bool:
    """Whether an interval ("500ba", "1ep", "1e6tok", "0.1dur") fires on the step from `before` to `after`.

    It fires when the count in the interval's unit crosses a multiple of the interval: "500ba" fires
    after batch 500, 1000, ...; "1e6tok" fires on the batch that reaches or passes each million tokens;
    "1ep" fires on the `to_next_epoch` step. Calling it at every batch end and at every epoch end never
    fires one interval twice for the same moment. `dur` is resolved against `max_duration` first.
    """
    interval = resolve_time(interval, max_duration, batches_per_epoch=batches_per_epoch)
    if interval.value <= 0:
        raise ValueError(f"an interval must be positive, got {interval}")
    start, end = before.get(interval.unit).value, after.get(interval.unit).value
    return start // interval.value < end // interval.value
