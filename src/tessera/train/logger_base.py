"""What every logger is given and implements (`RunInfo`, `Logger`), apart from the loggers themselves, so
the trackers (train/trackers/) and the settings that build them (logger_settings.py) depend on this small
module, not on each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.storage import Store

METRICS_ENV = "TESSERA_METRICS"   # the platform's per-run metrics file (loggers.MetricsStreamLogger)
METRICS_FILE = "metrics.jsonl"    # the JSONL logger's file under log_dir


@dataclass
class RunInfo:
    """What a logger knows about the run it logs."""

    run_name: str
    config: dict[str, Any] = field(default_factory=dict)
    log_dir: Path = Path("logs")
    remote: Store | None = None  # <save_folder>/logs, if the run saves checkpoints
    start_progress: float = 0.0  # fraction of the run already done when this process starts (a resume)


class Logger:
    """Base class: override what you need."""

    def start(self, run: RunInfo) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
