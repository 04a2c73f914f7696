"""Throughput, MFU, memory and where a step's time goes, measured without making the GPU wait.

`Throughput` is fed by the loop at a few points of every step and read at log points:

    begin_step(t0)            the host time the step started (before the batch was fetched)
    start_phases()            the batch is on the device
    mark("forward_backward")  after the microbatches' forward and backward
    mark("optimizer")         after clipping, the optimizer steps and zero_grad
    update(samples, tokens, data_wait) -> seconds of the step (host clock)
    metrics(...)              at a log point: rates, MFU, step-time breakdown, memory peaks
    summary(...)              at the end: the same over the whole run (eval time excluded)

A GPU runs the step asynchronously, so host timestamps of its phases say when work was queued, not when it
ran. On CUDA each mark records a CUDA event (no synchronisation) and the events are read at the next log
point, where the loop synchronises anyway to read the loss; so the breakdown there is device time of
forward+backward and of the optimizer, while the data wait is host time (the loader runs on the host, and
overlaps the device's work on the previous step). "other" is the rest of the wall time per step (moving
the batch, timestamps, logging, checkpoint stalls; on a GPU, host time the device was idle), never below 0.

Rates are over the last `window` steps, so a slow first step or a checkpoint stall fades out. MFU =
achieved model FLOP/s / (peak FLOP/s per device x devices), achieved = tokens/s x the model's training
FLOPs per token (`flops_per_token`, counting forward and backward, about 6 x parameters for a
transformer); the peaks come from `hardware.py`. On a CPU, or a device not in that table, MFU is left out.
Memory: CUDA's allocated and reserved peaks (host-side allocator counters, no sync), or on the CPU the
process's peak resident set (RSS).
"""

from __future__ import annotations

import collections
import resource
import sys
import time
from typing import Any

import torch

GB = 1e9
PHASES = ("forward_backward", "optimizer")


def flops_per_token(model: torch.nn.Module) -> float | None:
    """The model's `flops_per_token` (attribute or method), looking through DDP; None if it has none."""
    inner = getattr(model, "module", model)
    value: Any = getattr(inner, "flops_per_token", None)
    if callable(value):
        value = value()
    return float(value) if value else None


def memory_metrics(device: torch.device) -> dict[str, float]:
    """Peak memory so far: CUDA allocated/reserved on a GPU, the process's peak RSS otherwise."""
    if device.type == "cuda" and torch.cuda.is_available():
        return {"memory/allocated_peak_gb": torch.cuda.max_memory_allocated(device) / GB,
                "memory/reserved_peak_gb": torch.cuda.max_memory_reserved(device) / GB}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return {"memory/rss_peak_gb": peak * (1 if sys.platform == "darwin" else 1024) / GB}


class Throughput:
    """See the module docstring. `device` decides between host clocks and CUDA events for the phases."""

    def __init__(self, window: int = 20, device: torch.device | None = None) -> None:
        self._marks: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=window + 1)
        self._waits: collections.deque[float] = collections.deque(maxlen=window)
        self._cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
        self.device = device or torch.device("cpu")
        self._step_start = 0.0
        self._stamps: list[Any] = []  # this step's marks: host times, or CUDA events
        self._pending: list[list[Any]] = []  # marks of the steps since the last read, CUDA only
        self._interval = self._zero()  # seconds per phase since the last metrics()
        self._total = self._zero()  # over the run (training time only)
        self._run_start: tuple[int, int] | None = None

    @staticmethod
    def _zero() -> dict[str, float]:
        return {"steps": 0.0, "wall": 0.0, "data_wait": 0.0, **dict.fromkeys(PHASES, 0.0)}

    def start(self, samples: int = 0, tokens: int = 0) -> None:
        """Mark the start (or a restart after an eval or resume, whose time is not training time)."""
        self._marks.clear()
        self._waits.clear()
        self._marks.append((time.perf_counter(), samples, tokens))
        if self._run_start is None:
            self._run_start = (samples, tokens)

    def begin_step(self, t0: float) -> None:
        self._step_start = t0
        self._stamps = []

    def start_phases(self) -> None:
        """The batch is on the device: the timed phases start now."""
        self._stamps = [self._event() if self._cuda else time.perf_counter()]

    def mark(self, phase: str) -> None:
        """The end of `phase` (one of PHASES, in order) of this step."""
        assert PHASES[len(self._stamps) - 1] == phase, f"phase {phase!r} out of order"
        self._stamps.append(self._event() if self._cuda else time.perf_counter())

    @staticmethod
    def _event() -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def update(self, samples: int, tokens: int, data_wait: float) -> float:
        """After a step: the run's total samples and tokens so far and the seconds spent waiting for the
        batch; returns the step's seconds on the host clock (from before its batch was fetched)."""
        now = time.perf_counter()
        step = now - self._step_start if self._step_start else 0.0
        wall = now - self._marks[-1][0] if self._marks else step
        self._marks.append((now, samples, tokens))
        self._waits.append(data_wait)
        self._interval["steps"] += 1
        self._interval["wall"] += wall
        self._interval["data_wait"] += data_wait
        if len(self._stamps) == len(PHASES) + 1:
            if self._cuda:
                self._pending.append(self._stamps)
            else:
                for i, phase in enumerate(PHASES):
                    self._interval[phase] += self._stamps[i + 1] - self._stamps[i]
        self._stamps = []
        return step

    def _read_events(self) -> None:
        """Device times of the pending steps' phases: waits for the last event (a log point syncs anyway)."""
        if not self._pending:
            return
        self._pending[-1][-1].synchronize()
        for stamps in self._pending:
            for i, phase in enumerate(PHASES):
                self._interval[phase] += stamps[i].elapsed_time(stamps[i + 1]) / 1e3
        self._pending = []

    def metrics(self, world_size: int, model_flops_per_token: float | None = None,
                device_peak_flops: float | None = None) -> dict[str, float]:
        """Rates over the window, the step-time breakdown since the last call, memory peaks."""
        out: dict[str, float] = {}
        if len(self._marks) >= 2:
            (t0, s0, k0), (t1, s1, k1) = self._marks[0], self._marks[-1]
            seconds = t1 - t0
            if seconds > 0:
                out.update(_rates((len(self._marks) - 1, seconds, s1 - s0, k1 - k0), world_size,
                                  model_flops_per_token, device_peak_flops))
                out["time/data_wait_fraction"] = sum(self._waits) / seconds
        self._read_events()
        interval, self._interval = self._interval, self._zero()
        for key in self._total:
            self._total[key] += interval[key]
        out.update(_breakdown(interval))
        out.update(memory_metrics(self.device))
        return out

    def summary(self, world_size: int, samples: int, tokens: int, model_flops_per_token: float | None = None,
                device_peak_flops: float | None = None) -> dict[str, float]:
        """The whole run's figures (training time only), keyed `summary/...`; {} if no step ran."""
        self._read_events()
        total = dict(self._total)
        for key in total:
            total[key] += self._interval[key]
        if not total["steps"] or total["wall"] <= 0 or self._run_start is None:
            return {}
        s0, k0 = self._run_start
        out = _rates((int(total["steps"]), total["wall"], samples - s0, tokens - k0), world_size,
                     model_flops_per_token, device_peak_flops)
        out["time/data_wait_fraction"] = total["data_wait"] / total["wall"]
        out["time/train_sec"] = total["wall"]
        out.update(_breakdown(total))
        out.update(memory_metrics(self.device))
        return {f"summary/{key}": value for key, value in out.items()}


def _rates(span: tuple[int, float, int, int], world_size: int, model_flops_per_token: float | None,
           device_peak_flops: float | None) -> dict[str, float]:
    steps, seconds, samples, tokens = span
    out = {"throughput/samples_per_sec": samples / seconds, "throughput/batches_per_sec": steps / seconds}
    if tokens > 0:
        tokens_per_sec = tokens / seconds
        out["throughput/tokens_per_sec"] = tokens_per_sec
        out["throughput/device/tokens_per_sec"] = tokens_per_sec / world_size
        if model_flops_per_token:
            achieved = tokens_per_sec * model_flops_per_token
            out["throughput/flops_per_sec"] = achieved
            if device_peak_flops:
                out["throughput/mfu"] = achieved / (device_peak_flops * world_size)
    return out


def _breakdown(acc: dict[str, float]) -> dict[str, float]:
    """Mean seconds per step of each phase; "other" is what the wall time leaves (never below 0)."""
    steps = acc["steps"]
    if not steps:
        return {}
    timed = acc["data_wait"] + sum(acc[p] for p in PHASES)
    return {"time/step_sec": acc["wall"] / steps, "time/data_wait_sec": acc["data_wait"] / steps,
            "time/forward_backward_sec": acc["forward_backward"] / steps,
            "time/optimizer_sec": acc["optimizer"] / steps,
            "time/other_sec": max(0.0, acc["wall"] - timed) / steps}
