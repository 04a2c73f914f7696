"""Training: one `Trainer` loop, time units, LR schedules, checkpoints in any bucket (docs/training.md).

- `Trainer(model=..., optimizers=..., train_dataloader=..., max_duration="2ep", ...)`, its typed
  `TrainerConfig`, and `seed_all(seed)` for the same initial weights on every rank.
- `Callback`: hooks the loop calls; `Logger`, `ProgressLogger`, `JSONLLogger`, `TensorBoardLogger`.
- `Time`, `Timestamp`, `TimeUnit`: durations and intervals such as "500ba", "2ep", "1000000tok", "0.5dur".
- `CosineWithWarmup`, `LinearWithWarmup`, `ConstantWithWarmup`: LR schedules in those units.
- `CheckpointManager` (save, latest, load, retain; see `tessera.train.checkpoint`), and what resuming
  raises or warns: `CheckpointError`, `CheckpointCorrupt`, `CheckpointNotFound`, `CheckpointWarning`.
- `SimulatedOutOfMemory`: what tests raise to exercise auto-microbatching on CPU.

Names load on first use, so `tessera.train.time` and `tessera.train.schedule` stay usable without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and the reference docs see; at run time __getattr__ loads them
    from tessera.train.callbacks import Callback
    from tessera.train.checkpoint import (
        CheckpointCorrupt,
        CheckpointError,
        CheckpointManager,
        CheckpointNotFound,
        CheckpointWarning,
    )
    from tessera.train.config import TrainerConfig
    from tessera.train.loggers import JSONLLogger, Logger, ProgressLogger, TensorBoardLogger
    from tessera.train.microbatch import SimulatedOutOfMemory
    from tessera.train.schedule import ConstantWithWarmup, CosineWithWarmup, LinearWithWarmup
    from tessera.train.time import Time, Timestamp, TimeUnit
    from tessera.train.trainer import Trainer, seed_all

_EXPORTS = {
    "Trainer": "tessera.train.trainer", "seed_all": "tessera.train.trainer",
    "TrainerConfig": "tessera.train.config",
    "Callback": "tessera.train.callbacks",
    "Time": "tessera.train.time", "Timestamp": "tessera.train.time", "TimeUnit": "tessera.train.time",
    "CosineWithWarmup": "tessera.train.schedule", "ConstantWithWarmup": "tessera.train.schedule",
    "LinearWithWarmup": "tessera.train.schedule",
    "CheckpointManager": "tessera.train.checkpoint", "CheckpointError": "tessera.train.checkpoint",
    "CheckpointCorrupt": "tessera.train.checkpoint", "CheckpointNotFound": "tessera.train.checkpoint",
    "CheckpointWarning": "tessera.train.checkpoint",
    "Logger": "tessera.train.loggers", "ProgressLogger": "tessera.train.loggers",
    "JSONLLogger": "tessera.train.loggers", "TensorBoardLogger": "tessera.train.loggers",
    "SimulatedOutOfMemory": "tessera.train.microbatch",
}
# A literal list (not sorted(_EXPORTS)) so tools that read the source without running it see the names.
__all__ = [
    "Callback", "CheckpointCorrupt", "CheckpointError", "CheckpointManager", "CheckpointNotFound",
    "CheckpointWarning", "ConstantWithWarmup", "CosineWithWarmup", "JSONLLogger", "LinearWithWarmup", "Logger",
    "ProgressLogger", "SimulatedOutOfMemory", "TensorBoardLogger", "Time", "TimeUnit", "Timestamp", "Trainer",
    "TrainerConfig", "seed_all",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tessera.train' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
