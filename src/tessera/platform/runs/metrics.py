"""A run's metrics: what the trainer reports for the console's plots and `Platform.run_metrics`.

Every run gets `TESSERA_METRICS=<run folder>/metrics.jsonl` (submission.py); a trainer that sees it
appends one JSON object per log line on rank 0 ({"step": n, "loss/train": x, "lr": y, ...}). The file is
per run, not per resumption, so a resumed run's curve continues in the same file. Readers follow it by
byte offset, like the heartbeat events (progress.py), so a poll returns only the rows it has not seen.
Rows pass through the same `Redactor` as the logs: a run may write a secret into its metrics as into its
log, so whoever reads a run's metrics sees its strings masked as its log lines are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera.platform.runs.progress import read_json_lines
from tessera.platform.secrets.redaction import Redactor

METRICS_FILE = "metrics.jsonl"
READ_LIMIT = 1 << 20   # bytes per call: a long run's file is read in pages, never all at once


def metrics_path(run_folder: str | Path) -> Path:
    return Path(run_folder) / METRICS_FILE


def read_metrics(run_folder: str | Path, redact: Redactor, after: int = 0,
                 limit: int = READ_LIMIT) -> tuple[list[dict[str, Any]], int]:
    """(rows of the complete lines after byte `after`, masked by `redact`; the offset to pass next time)."""
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"metrics offset must be a byte offset >= 0, got {after!r}")
    rows, offset = read_json_lines(metrics_path(run_folder), after, limit)
    return [redact.json(row) for row in rows], offset
