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

from typing import TYPE_CHECKING

from tessera.lazy_exports import lazy_exports

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

__getattr__ = lazy_exports(__name__, {
    "trainer": ["Trainer", "seed_all"],
    "config": ["TrainerConfig"],
    "callbacks": ["Callback"],
    "time": ["Time", "Timestamp", "TimeUnit"],
    "schedule": ["CosineWithWarmup", "ConstantWithWarmup", "LinearWithWarmup"],
    "checkpoint": ["CheckpointManager", "CheckpointError", "CheckpointCorrupt", "CheckpointNotFound",
                   "CheckpointWarning"],
    "loggers": ["Logger", "ProgressLogger", "JSONLLogger", "TensorBoardLogger"],
    "microbatch": ["SimulatedOutOfMemory"],
})
# A literal list (not made from the table) so tools that read the source without running it see the names.
__all__ = [
    "Callback", "CheckpointCorrupt", "CheckpointError", "CheckpointManager", "CheckpointNotFound",
    "CheckpointWarning", "ConstantWithWarmup", "CosineWithWarmup", "JSONLLogger", "LinearWithWarmup", "Logger",
    "ProgressLogger", "SimulatedOutOfMemory", "TensorBoardLogger", "Time", "TimeUnit", "Timestamp", "Trainer",
    "TrainerConfig", "seed_all",
]

