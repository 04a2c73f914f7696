"""Where the training metrics come from, for code that imports them from here: the throughput meter,
MFU and memory figures live in `throughput.py`, the accelerators' peak FLOP/s and memory in `hardware.py`.
"""

from __future__ import annotations

from tessera.train.hardware import device_peak_flops as peak_flops  # a device's peak FLOP/s at a precision
from tessera.train.throughput import Throughput, flops_per_token, memory_metrics

__all__ = ["Throughput", "flops_per_token", "memory_metrics", "peak_flops"]
