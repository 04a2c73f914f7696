"""The tables of the platform's state database (state.py), the records their rows are read into, and
how an older file is brought up to date.

`PRAGMA user_version` holds SCHEMA_VERSION. Opening a file of an older version runs SCHEMA (every statement
is IF NOT EXISTS), adds the MIGRATIONS columns the file lacks, then LIST_INDEXES (they need those columns).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS clusters (
    name TEXT PRIMARY KEY, type TEXT NOT NULL, config TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, spec TEXT NOT NULL, status TEXT NOT NULL,
    cluster TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, ended REAL,
    request TEXT, request_arg TEXT, retries_used INTEGER NOT NULL DEFAULT 0,
    system_retries INTEGER NOT NULL DEFAULT 0, failure_kind TEXT, first_error TEXT, not_before REAL,
    folder TEXT NOT NULL, workdir TEXT, next_cause TEXT, user TEXT);
CREATE INDEX IF NOT EXISTS runs_status ON runs(status);
CREATE INDEX IF NOT EXISTS runs_created ON runs(created);
CREATE TABLE IF NOT EXISTS resumptions (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, idx INTEGER NOT NULL,
    cluster TEXT NOT NULL, cause TEXT NOT NULL, status TEXT NOT NULL, job_id TEXT, handle TEXT,
    nodes TEXT NOT NULL DEFAULT '[]', folder TEXT NOT NULL, submitted REAL NOT NULL, start REAL, end REAL,
    exit_code INTEGER, outcome TEXT, detail TEXT, last_beat TEXT, last_progress REAL, stop_sent REAL,
    kill_sent REAL, stop_reason TEXT, first_beat TEXT, events_offset INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, idx));
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    time REAL NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL, data TEXT);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id, id);
CREATE TABLE IF NOT EXISTS node_faults (
    cluster TEXT NOT NULL, node TEXT NOT NULL, faults INTEGER NOT NULL, excluded INTEGER NOT NULL,
    reason TEXT NOT NULL, updated REAL NOT NULL, PRIMARY KEY (cluster, node));
CREATE TABLE IF NOT EXISTS supervisor (
    id INTEGER PRIMARY KEY CHECK (id = 1), pid INTEGER NOT NULL, started REAL NOT NULL, beat REAL NOT NULL);
"""

# Columns added after version 1 (table, column, SQL type): an older file gets them when it is opened.
MIGRATIONS = (("runs", "user", "TEXT"),)
# Made after the migrations (an older file has no `user` column before them): a filtered page of the runs
# list reads an index in order instead of sorting every run of the team.
LIST_INDEXES = """
CREATE INDEX IF NOT EXISTS runs_status_created ON runs(status, created);
CREATE INDEX IF NOT EXISTS runs_user_created ON runs(user, created);
CREATE INDEX IF NOT EXISTS runs_user_status_created ON runs(user, status, created);
"""


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


def from_row(cls: type, row: sqlite3.Row) -> Any:
    """A record from a row: JSON columns decoded."""
    values = {k: (json.loads(row[k]) if k in _JSON_FIELDS and row[k] is not None else row[k])
              for k in row.keys()}
    return cls(**values)


def encode(value: Any, key: str) -> Any:
    """A record's field as its column holds it: JSON columns encoded."""
    return json.dumps(value) if key in _JSON_FIELDS and value is not None else value
