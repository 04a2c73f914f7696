"""Homes as the version before the one store made them (commit 4c9037a): a raw SQLite `state.db` with
`PRAGMA user_version` 1 or 3 (its schema SQL copied here verbatim from that commit's state_schema.py, so
the test does not depend on the code it checks), and secrets as Fernet-encrypted `NAME.secret` files.

`build_old_home` fills one with every kind of row (clusters, runs of every status, resumptions with their
handles and heartbeats, events, node faults), and returns what it wrote, to compare row by row."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet

SCHEMA_V3 = """
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
LIST_INDEXES_V3 = """
CREATE INDEX IF NOT EXISTS runs_status_created ON runs(status, created);
CREATE INDEX IF NOT EXISTS runs_user_created ON runs(user, created);
CREATE INDEX IF NOT EXISTS runs_user_status_created ON runs(user, status, created);
"""
# Version 1 had no runs.user column (nor the indexes on it).
SCHEMA_V1 = SCHEMA_V3.replace(", user TEXT", "")
STATUSES = ("COMPLETED", "FAILED", "STOPPED", "PENDING", "QUEUED", "RUNNING")


def spec(name: str) -> dict[str, Any]:
    return {"name": name, "command": f"echo {name}", "compute": {"cluster": "local"}}


def build_old_home(home: Path, runs: int, *, version: int = 3, users: bool = True) -> dict[str, list[tuple]]:
    """An old home's state.db with `runs` runs (statuses in turn, two resumptions and three events each),
    a cluster and a node fault; returns {table: rows as tuples} as written, each naming its run by name (ids
    are the same in every home built here: a store importing two of them must give one of them new ones)."""
    home.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(home / "state.db")
    db.executescript((SCHEMA_V1 if version == 1 else SCHEMA_V3 + LIST_INDEXES_V3) + f"PRAGMA user_version = {version};")
    written: dict[str, list[tuple]] = {"runs": [], "resumptions": [], "events": []}
    base = time.time() - 10_000
    for i in range(runs):
        run_id, name, status = f"{i:012x}", f"old-{i:04d}", STATUSES[i % len(STATUSES)]
        folder = str(home / "runs" / name)
        row = (run_id, name, json.dumps(spec(name)), status, "local", base + i, base + i + 1, folder)
        user = (f"user{i % 3}",) if version >= 3 and users else ()
        db.execute(f"INSERT INTO runs (id, name, spec, status, cluster, created, updated, folder"
                   f"{', user' if user else ''}) VALUES (?, ?, ?, ?, ?, ?, ?, ?{', ?' if user else ''})", row + user)
        written["runs"].append((name, status, base + i, user[0] if user else None))
        for idx in range(2):
            handle = json.dumps({"job_id": str(1000 + i), "pid": 1000 + i, "folder": f"{folder}/r{idx}"})
            db.execute("INSERT INTO resumptions (run_id, idx, cluster, cause, status, job_id, handle, folder, "
                       "submitted, last_beat, events_offset) VALUES (?, ?, 'local', ?, ?, ?, ?, ?, ?, ?, ?)",
                       (run_id, idx, "submitted" if idx == 0 else "retry", "COMPLETED", str(1000 + i), handle,
                        f"{folder}/r{idx}", base + i, json.dumps({"step": idx * 10}), idx * 100))
            written["resumptions"].append((name, idx, f"{folder}/r{idx}", idx * 100))
        for k in range(3):
            db.execute("INSERT INTO events (run_id, time, kind, message) VALUES (?, ?, ?, ?)",
                       (run_id, base + i + k, f"kind{k}", f"event {k} of {name}"))
            written["events"].append((name, f"kind{k}", f"event {k} of {name}"))
    db.execute("INSERT INTO clusters VALUES ('slurm-a', 'slurm', ?, ?)", (json.dumps({"partition": "gpu"}), base))
    db.execute("INSERT INTO node_faults VALUES ('slurm-a', 'n1', 2, 1, 'xid 79', ?)", (base,))
    db.commit()
    db.close()
    return written


def write_old_secret(home: Path, key: bytes, name: str, values: dict[str, str]) -> None:
    """A `NAME.secret` file as the old SecretStore wrote it: a Fernet token of the record's JSON."""
    folder = home / "secrets"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    record = {"type": "env", "name": name, "values": values, "created": 1.0}
    (folder / f"{name}.secret").write_bytes(Fernet(key).encrypt(json.dumps(record).encode()))
