"""`WandBLogger`: the run in Weights & Biases: the config (secrets dropped), the metrics with their step;
a resumed training run continues the same W&B run (same id, `resume="allow"`).

    Trainer(..., loggers=["progress", WandBLogger(project="lm", mode="offline")])
    # or in a recipe:  loggers: {progress: {}, wandb: {project: lm, entity: my-team, mode: online}}

W&B writes under `<log_dir>/wandb/` (offline runs: `offline-run-*/run-<id>.wandb`, uploaded later with
`wandb sync`). Online mode needs `WANDB_API_KEY` in the run's environment (a platform `env` secret), never
in the recipe. The run id is kept with the run's logs and checkpoints (record.py) and reused on resume;
W&B itself drops a step lower than the run's current one, so steps replayed after a resume are not
duplicated online. Rank 0 only.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from tessera.train.logger_base import Logger, RunInfo
from tessera.train.trackers.record import TrackerRunRecord, without_secrets

RECORD_FILE = "wandb_run.json"


class WandBLogger(Logger):
    """Logs a training run to Weights & Biases (module docstring)."""

    def __init__(self, project: str | None = None, entity: str | None = None, run_name: str | None = None,
                 mode: str | None = None, group: str | None = None, tags: list[str] | None = None) -> None:
        self.project, self.entity, self.run_name, self.mode = project, entity, run_name, mode
        self.group, self.tags = group, list(tags or [])
        self.run_id: str | None = None
        self._run: Any = None

    def start(self, run: RunInfo) -> None:
        if int(os.environ.get("RANK", "0")) != 0:
            return
        import wandb  # slow to import: only when a run logs to W&B

        record = TrackerRunRecord(run, RECORD_FILE)
        previous = record.previous() or {}
        run_id = previous.get("run_id")
        self.run_id = run_id if isinstance(run_id, str) and run_id else uuid.uuid4().hex[:8]  # W&B's id shape
        record.save({"run_id": self.run_id})
        run.log_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=self.project, entity=self.entity, group=self.group, tags=self.tags or None,
                               name=self.run_name or os.environ.get("RUN_NAME") or run.run_name or None,
                               mode=self.mode, id=self.run_id, resume="allow", dir=str(run.log_dir),
                               config=without_secrets(run.config), reinit="create_new")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._run is not None:
            self._run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
