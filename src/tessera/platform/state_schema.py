"""The tables of the platform's state database (state.py), and how an older file is brought up to date.

`PRAGMA user_version` holds SCHEMA_VERSION. Opening a file of an older version runs SCHEMA (every statement
is IF NOT EXISTS), adds the MIGRATIONS columns the file lacks, then LIST_INDEXES (they need those columns).
"""

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
