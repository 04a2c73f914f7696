"""Throughput and model FLOPs utilisation (MFU).

`Throughput` keeps the last `window` batches (wall time, global samples and tokens, time spent waiting
for data) and reports rates over them, so a slow first batch or a checkpoint stall fades out.

MFU = achieved model FLOP/s / (peak FLOP/s per device x devices), where achieved = tokens/s x the
model's training FLOPs per token. A model opts in by exposing `flops_per_token` (a number or a method),
counting forward and backward (about 6 x parameters for a transformer, plus attention). Peaks are the
dense tensor-core figures of common accelerators (`PEAK_FLOPS`); for a device not in the table (or the
CPU) MFU is omitted rather than guessed.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import torch

# Dense (no sparsity) peak FLOP/s per device by precision. Longer names first: "H100 PCIe" before "H100".
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 NVL", {"bf16": 835e12, "fp16": 835e12, "fp32": 60e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("H200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("GH200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("B200", {"bf16": 2250e12, "fp16": 2250e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    ("L40S", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),
    ("A10", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
    ("L4", {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12}),
    ("V100", {"fp16": 125e12, "fp32": 15.7e12}),
    ("T4", {"fp16": 65e12, "fp32": 8.1e12}),
    ("MI300X", {"bf16": 1307e12, "fp16": 1307e12, "fp32": 163.4e12}),
    ("MI250X", {"bf16": 383e12, "fp16": 383e12}),
]
_PRECISION_KEY = {"fp32": "fp32", "amp_bf16": "bf16", "amp_fp16": "fp16"}


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The peak FLOP/s of one `device` at `precision`, or None if unknown (CPU, unlisted GPU)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    key = _PRECISION_KEY.get(precision, precision)
    for pattern, peaks in PEAK_FLOPS:
        if pattern in name:
            return peaks.get(key)
    return None


def flops_per_token(model: torch.nn.Module) -> float | None:
    """The model's `flops_per_token` (attribute or method), looking through DDP; None if it has none."""
    inner = getattr(model, "module", model)
    value: Any = getattr(inner, "flops_per_token", None)
    if callable(value):
        value = value()
    return float(value) if value else None


class Throughput:
    """Rates over the last `window` batches; see the module docstring."""

    def __init__(self, window: int = 20) -> None:
        self._marks: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=window + 1)
        self._waits: collections.deque[float] = collections.deque(maxlen=window)

    def start(self, samples: int = 0, tokens: int = 0) -> None:
        """Mark the start (or a restart after an eval or resume, whose time is not training time)."""
        self._marks.clear()
        self._waits.clear()
        self._marks.append((time.perf_counter(), samples, tokens))

    def update(self, samples: int, tokens: int, data_wait: float) -> None:
        """After a batch: the run's total samples and tokens so far, and the seconds spent waiting for it."""
        self._marks.append((time.perf_counter(), samples, tokens))
        self._waits.append(data_wait)

    def metrics(self, world_size: int, model_flops_per_token: float | None = None,
                device_peak_flops: float | None = None) -> dict[str, float]:
        if len(self._marks) < 2:
            return {}
        (t0, s0, k0), (t1, s1, k1) = self._marks[0], self._marks[-1]
        seconds = t1 - t0
        if seconds <= 0:
            return {}
        out = {"throughput/samples_per_sec": (s1 - s0) / seconds,
               "throughput/batches_per_sec": (len(self._marks) - 1) / seconds,
               "time/data_wait_fraction": sum(self._waits) / seconds}
        if k1 > k0:
            tokens_per_sec = (k1 - k0) / seconds
            out["throughput/tokens_per_sec"] = tokens_per_sec
            out["throughput/device/tokens_per_sec"] = tokens_per_sec / world_size
            if model_flops_per_token:
                achieved = tokens_per_sec * model_flops_per_token
                out["throughput/flops_per_sec"] = achieved
                if device_peak_flops:
                    out["throughput/mfu"] = achieved / (device_peak_flops * world_size)
        return out
