"""The records the store's rows are read into (state.py), and how their JSON columns are encoded."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Lifecycle. STOPPING is the short stretch between a stop/move request and the processes' exit.
PENDING, QUEUED, STARTING, RUNNING, STOPPING = "PENDING", "QUEUED", "STARTING", "RUNNING", "STOPPING"
COMPLETED, FAILED, STOPPED = "COMPLETED", "FAILED", "STOPPED"
ACTIVE = (PENDING, QUEUED, STARTING, RUNNING, STOPPING)
TERMINAL = (COMPLETED, FAILED, STOPPED)
ALL_STATUSES = ACTIVE + TERMINAL
# A resumption's status while the supervisor submits it: the row is written before the job exists, so a
# supervisor that dies between submitting and recording the job id finds the job again (submission.py).
SUBMITTING = "SUBMITTING"


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class ClusterRecord:
    name: str
    type: str
    config: dict[str, Any]
    created: float


@dataclass
class RunRecord:
    id: str
    name: str
    spec: dict[str, Any]
    status: str
    cluster: str
    created: float
    updated: float
    folder: str
    ended: float | None = None
    request: str | None = None
    request_arg: str | None = None
    retries_used: int = 0
    system_retries: int = 0
    failure_kind: str | None = None
    first_error: str | None = None
    not_before: float | None = None
    workdir: str | None = None
    next_cause: str | None = None
    user: str | None = None          # who submitted it (the OS user locally, the API user on a server)
    metrics_next: int = 0            # the position in its shipped metrics the store has ingested up to
    deleted: float | None = None     # when it was deleted, if it was (a soft delete: MCLI's deleteRuns)


@dataclass
class ResumptionRecord:
    run_id: str
    idx: int
    cluster: str
    cause: str
    status: str
    folder: str
    submitted: float
    job_id: str | None = None
    handle: dict[str, Any] | None = None
    nodes: list[str] = field(default_factory=list)
    start: float | None = None
    end: float | None = None
    exit_code: int | None = None
    outcome: str | None = None
    detail: str | None = None
    last_beat: dict[str, Any] | None = None
    last_progress: float | None = None
    stop_sent: float | None = None
    kill_sent: float | None = None
    stop_reason: str | None = None
    first_beat: dict[str, Any] | None = None
    events_offset: int = 0


@dataclass
class EventRecord:
    id: int
    run_id: str
    time: float
    kind: str
    message: str
    data: dict[str, Any] | None = None


_JSON_FIELDS = {"spec", "config", "handle", "nodes", "last_beat", "first_beat", "data"}


def from_row(cls: type, row: Mapping[str, Any]) -> Any:
    """A record from a row (a mapping of column to value, extra columns ignored): JSON columns decoded."""
    names = cls.__dataclass_fields__
    return cls(**{k: (json.loads(v) if k in _JSON_FIELDS and v is not None else v)
                  for k, v in row.items() if k in names})


def encode(value: Any, key: str) -> Any:
    """A record's field as its column holds it: JSON columns encoded."""
    return json.dumps(value) if key in _JSON_FIELDS and value is not None else value


def columns(record: Any) -> dict[str, Any]:
    """Every field of a record as its column holds it."""
    return {k: encode(v, k) for k, v in record.__dict__.items()}
