"""`MLflowLogger`: the run in MLflow: the config as params, the metrics at every log interval, the
metrics file and the config as artifacts at the end; a resumed training run continues the same MLflow run.

    Trainer(..., loggers=["progress", MLflowLogger(tracking_uri="sqlite:///mlflow.db", experiment="lm")])
    # or in a recipe:  loggers: {progress: {}, mlflow: {tracking_uri: http://mlflow:5000, experiment: lm}}

Through `MlflowClient` (not the fluent `mlflow.start_run`), so no process-global active run is touched:
each logged step is one `log_batch` call (one HTTP request to a server), never one per metric. The MLflow
run id is kept with the run's logs and checkpoints (record.py); on resume the same run is reopened, and a
step it already holds for a key (logged after the checkpoint the run resumed from) is not sent again,
so MLflow's history has one value per step. Rank 0 only (the Trainer starts loggers on rank 0; this
checks too). A failure to log mid-run is a warning, not the end of the training run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera.train.logger_base import METRICS_ENV, METRICS_FILE, Logger, RunInfo
from tessera.train.trackers.record import TrackerRunRecord, flat_params, without_secrets

log = logging.getLogger(__name__)

RECORD_FILE = "mlflow_run.json"
PARAMS_PER_CALL = 100    # MLflow's log_batch limits: 100 params and 1000 metrics per request
METRICS_PER_CALL = 1000
PARAM_VALUE_LIMIT = 6000


def _key(name: str) -> str:
    """MLflow allows letters, digits, '_', '-', '.', ' ', '/' in names; anything else becomes '_'."""
    return re.sub(r"[^\w\-. /]", "_", name)[:250]


def _artifacts_beside(tracking_uri: str) -> str | None:
    """For a local sqlite store, `<its folder>/mlartifacts`: MLflow would otherwise put a new experiment's
    artifacts under ./mlruns of whatever folder the run started in. None (MLflow's choice) otherwise."""
    if not tracking_uri.startswith("sqlite:///") or tracking_uri.endswith(":memory:"):
        return None
    return (Path(tracking_uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()


def _first_sentence(text: str) -> str:
    return " ".join(text.split(". ")[0].split()).rstrip(".") + "."


class MLflowLogger(Logger):
    """Logs a training run to MLflow (module docstring)."""

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None, run_name: str | None = None,
                 tags: dict[str, str] | None = None, artifacts: bool = True) -> None:
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.tags, self.artifacts = dict(tags or {}), artifacts
        self.run_id: str | None = None
        self._client: Any = None
        self._run: RunInfo | None = None
        self._last_step: dict[str, int] = {}  # per key, what MLflow already holds (a resumed run)
        self._failures = 0

    def start(self, run: RunInfo) -> None:
        if int(os.environ.get("RANK", "0")) != 0:
            return
        from mlflow.exceptions import MlflowException  # slow to import: only when a run logs to MLflow
        from mlflow.tracking import MlflowClient

        self._run = run
        record = TrackerRunRecord(run, RECORD_FILE)
        try:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
            previous = record.previous()
            if previous and self._reopen(previous.get("run_id")):
                log.info("continuing MLflow run %s", self.run_id)
            else:
                self._create(run)
            self._log_params(flat_params(run.config))
        except MlflowException as exc:  # a store MLflow refuses or cannot reach: one line, the run stops here
            self._client = None
            where = self.tracking_uri or "MLflow's default tracking URI"
            raise ValueError(f"loggers.mlflow: cannot log to {where}: {_first_sentence(exc.message)}") from None
        record.save({"run_id": self.run_id})

    def _create(self, run: RunInfo) -> None:
        name = self.run_name or os.environ.get("RUN_NAME") or run.run_name or None
        tags = {"tessera.run_name": run.run_name, **self.tags}
        created = self._client.create_run(self._experiment_id(), run_name=name, tags=tags)
        self.run_id = created.info.run_id

    def _reopen(self, run_id: Any) -> bool:
        """Reopen the recorded run (RUNNING again) and note the last step of each of its metrics."""
        from mlflow.exceptions import MlflowException

        if not isinstance(run_id, str):
            return False
        try:
            found = self._client.get_run(run_id)
        except MlflowException as exc:
            log.warning("MLflow run %s from the last attempt is not in %s (%s): starting a new run", run_id,
                        self._client.tracking_uri, exc)
            return False
        self.run_id = run_id
        self._last_step = {m.key: m.step for m in found.data.to_proto().metrics}
        self._client.update_run(run_id, status="RUNNING")
        return True

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        name = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if not name:
            return "0"  # MLflow's Default experiment
        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self._client.create_experiment(name, artifact_location=_artifacts_beside(self._client.tracking_uri))
        except MlflowException:  # another run created it meanwhile
            found = self._client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _log_params(self, params: dict[str, str]) -> None:
        """Params are immutable in MLflow: a resumed run adds the new ones and warns about changed ones."""
        from mlflow.entities import Param

        assert self.run_id is not None
        existing = self._client.get_run(self.run_id).data.params
        changed = sorted(k for k, v in params.items() if _key(k) in existing
                         and existing[_key(k)] != v[:PARAM_VALUE_LIMIT])
        if changed:
            log.warning("MLflow params keep their first values; changed since: %s", ", ".join(changed[:10]))
        new = [Param(_key(k), v[:PARAM_VALUE_LIMIT]) for k, v in params.items() if _key(k) not in existing]
        for i in range(0, len(new), PARAMS_PER_CALL):
            self._client.log_batch(self.run_id, params=new[i:i + PARAMS_PER_CALL])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_key(k), float(v), now, step) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and step > self._last_step.get(_key(k), -1)]
        for metric in batch:
            self._last_step[metric.key] = step
        try:
            for i in range(0, len(batch), METRICS_PER_CALL):
                self._client.log_batch(self.run_id, metrics=batch[i:i + METRICS_PER_CALL])
        except Exception as exc:  # noqa: BLE001 (a tracker outage must not end a training run)
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.warning("MLflow log_batch failed (%d time(s) so far; metrics of step %d dropped): %s",
                            self._failures, step, exc)

    def close(self) -> None:
        if self._client is None:
            return
        try:
            if self.artifacts and self._run is not None:
                self._log_artifacts(self._run)
        finally:
            self._client.set_terminated(self.run_id, "FINISHED")
            self._client = None

    def _log_artifacts(self, run: RunInfo) -> None:
        """metrics.jsonl (the run's own file, else the platform's stream) and config.json."""
        stream = os.environ.get(METRICS_ENV)
        for file in (run.log_dir / METRICS_FILE, Path(stream) if stream else None):
            if file is not None and file.is_file():
                self._client.log_artifact(self.run_id, str(file))
                break
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "config.json"
            config.write_text(json.dumps(without_secrets(run.config), indent=2, default=str))
            self._client.log_artifact(self.run_id, str(config))
