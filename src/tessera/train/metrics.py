"""Where the training metrics come from, for code that imports them from here: the throughput meter,
MFU and memory figures live in `throughput.py`, the accelerators' peak FLOP/s and memory in `hardware.py`.
"""

from __future__ import annotations

import torch

from tessera.train.hardware import device_peak_flops
from tessera.train.throughput import Throughput, flops_per_token, memory_metrics


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The peak FLOP/s of one `device` at a Trainer `precision`, or None (CPU, unlisted GPU)."""
    return device_peak_flops(device, precision)


__all__ = ["Throughput", "flops_per_token", "memory_metrics", "peak_flops"]
