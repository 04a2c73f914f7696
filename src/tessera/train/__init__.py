"""Training: `Trainer`, time units, LR schedules, checkpoints in any bucket (docs/training.md).

Names load lazily, so `tessera.train.time` and `tessera.train.schedule` stay usable without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Trainer": "tessera.train.trainer", "seed_all": "tessera.train.trainer",
    "TrainerConfig": "tessera.train.config",
    "Callback": "tessera.train.callbacks",
    "Time": "tessera.train.time", "Timestamp": "tessera.train.time", "TimeUnit": "tessera.train.time",
    "CosineWithWarmup": "tessera.train.schedule", "ConstantWithWarmup": "tessera.train.schedule",
    "LinearWithWarmup": "tessera.train.schedule",
    "CheckpointManager": "tessera.train.checkpoint", "CheckpointCorrupt": "tessera.train.checkpoint",
    "CheckpointWarning": "tessera.train.checkpoint",
    "Logger": "tessera.train.loggers", "ProgressLogger": "tessera.train.loggers",
    "JSONLLogger": "tessera.train.loggers", "TensorBoardLogger": "tessera.train.loggers",
    "SimulatedOutOfMemory": "tessera.train.microbatch",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tessera.train' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
