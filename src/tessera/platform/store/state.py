"""The control plane's state: one SQLite file (`$TESSERA_HOME/state.db`) in WAL mode.

A CLI, the SDK and the supervisor each open their own connection; WAL lets readers run beside the one
writer, writes take the write lock up front (`BEGIN IMMEDIATE`) and wait up to 30 s for it. Tables:
clusters, runs, resumptions (every start of a run), events, node_faults (per cluster) and supervisor.
`PRAGMA user_version` is the schema's version; opening an older file migrates it in place (state_schema.py).
Secret values are never written here: specs name secrets, and every text that came from a run's logs
is redacted before it is stored.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tessera.platform.errors import ClusterError, RunExists
from tessera.platform.home import tessera_home
from tessera.platform.store.state_schema import (
    LIST_INDEXES,
    MIGRATIONS,
    SCHEMA,
    SCHEMA_VERSION,
    ClusterRecord,
    EventRecord,
    ResumptionRecord,
    RunRecord,
    encode,
    from_row,
)

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


_CHUNK = 500   # run ids per IN (...) query: old SQLite builds allow only 999 bound variables


def _run_filter(statuses: tuple[str, ...] | None, cluster: str | None, user: str | None,
                q: str | None) -> tuple[str, list[Any]]:
    """The WHERE clause (with its arguments) shared by `list_runs` and `count_runs`."""
    parts: list[str] = []
    args: list[Any] = []
    if statuses:
        parts.append(f"status IN ({', '.join('?' * len(statuses))})")
        args += list(statuses)
    if cluster:
        parts.append("cluster = ?")
        args.append(cluster)
    if user:
        parts.append("user = ?")
        args.append(user)
    if q:
        parts.append("instr(name, ?) > 0")   # run names are lower case, so the search is too
        args.append(q.lower())
    return (" WHERE " + " AND ".join(parts)) if parts else "", args


class StateDB:
    """One connection to the state database; cheap to create, not shared across threads."""

    def __init__(self, home: str | Path | None = None) -> None:
        self.home = tessera_home(home)
        self.path = self.home / "state.db"
        fresh = not self.path.exists()
        self.conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        if fresh:
            self.path.chmod(0o600)
        self.conn.execute("PRAGMA busy_timeout = 30000")
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA foreign_keys = ON")
        if self.conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            with self.write():
                self._statements(SCHEMA)
                self._migrate()
                self._statements(LIST_INDEXES)
                self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _statements(self, script: str) -> None:
        """Each statement of `script` inside the caller's transaction (executescript would commit it)."""
        for statement in filter(str.strip, script.split(";")):
            self.conn.execute(statement)

    def _migrate(self) -> None:
        """Add the columns an older file lacks (inside the write lock, so two openers add them once)."""
        for table, column, type_ in MIGRATIONS:
            have = {row["name"] for row in self.conn.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {type_}")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> StateDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the lock at once, so two writers never deadlock."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # --- clusters ---------------------------------------------------------------------------------

    def add_cluster(self, name: str, type_: str, config: dict[str, Any], replace: bool = False) -> None:
        """ClusterError if the name is taken and not `replace`d (the unique name decides a race)."""
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        try:
            with self.write() as c:
                c.execute(f"{verb} INTO clusters (name, type, config, created) VALUES (?, ?, ?, ?)",
                          (name, type_, json.dumps(config), time.time()))
        except sqlite3.IntegrityError:
            raise ClusterError(f"cluster {name!r} exists; remove it first (tessera cluster remove {name})") from None

    def get_cluster(self, name: str) -> ClusterRecord | None:
        row = self.conn.execute("SELECT * FROM clusters WHERE name = ?", (name,)).fetchone()
        return from_row(ClusterRecord, row) if row else None

    def list_clusters(self) -> list[ClusterRecord]:
        return [from_row(ClusterRecord, r) for r in self.conn.execute("SELECT * FROM clusters ORDER BY name")]

    def remove_cluster(self, name: str) -> bool:
        with self.write() as c:
            return c.execute("DELETE FROM clusters WHERE name = ?", (name,)).rowcount > 0

    # --- runs -------------------------------------------------------------------------------------

    def insert_run(self, run: RunRecord, *, event: str | None = None,
                   publish: Callable[[], None] | None = None) -> None:
        """Claim the run's name, then write its folder (`publish`) and its 'created' `event`, in one
        transaction.

        The INSERT comes first, under the write lock (BEGIN IMMEDIATE): the unique name decides between
        racing submissions before any of them touches a file, and a loser raises RunExists having written
        nothing. `publish` runs while no other writer can claim the name, so the folder it writes is the
        winner's alone. If it fails, or the process is killed before COMMIT, the claim is rolled back and
        the half-written folder belongs to no run (the next claimant of the name clears it)."""
        data = {k: encode(v, k) for k, v in run.__dict__.items()}
        try:
            with self.write() as c:
                c.execute(f"INSERT INTO runs ({', '.join(data)}) VALUES ({', '.join('?' * len(data))})",
                          tuple(data.values()))
                if event:
                    c.execute("INSERT INTO events (run_id, time, kind, message) VALUES (?, ?, 'created', ?)",
                              (run.id, run.created, event))
                if publish:
                    publish()
        except sqlite3.IntegrityError as exc:   # another submission took the name since it was checked
            if "runs.name" not in str(exc):
                raise
            raise RunExists(f"a run named {run.name!r} exists; choose another name") from None

    def get_run(self, name_or_id: str) -> RunRecord | None:
        row = self.conn.execute("SELECT * FROM runs WHERE name = ? OR id = ? ORDER BY name = ? DESC LIMIT 1",
                                (name_or_id, name_or_id, name_or_id)).fetchone()
        return from_row(RunRecord, row) if row else None

    def list_runs(self, statuses: tuple[str, ...] | None = None, cluster: str | None = None,
                  limit: int | None = None, *, user: str | None = None, offset: int = 0,
                  q: str | None = None) -> list[RunRecord]:
        """Runs newest first; `q` keeps the names containing it."""
        where, args = _run_filter(statuses, cluster, user, q)
        sql = f"SELECT * FROM runs{where} ORDER BY created DESC, rowid DESC"
        if limit or offset:
            sql += " LIMIT ? OFFSET ?"
            args += [int(limit) if limit else -1, int(offset)]
        return [from_row(RunRecord, r) for r in self.conn.execute(sql, args)]

    def count_runs(self, statuses: tuple[str, ...] | None = None, cluster: str | None = None, *,
                   user: str | None = None, q: str | None = None) -> int:
        where, args = _run_filter(statuses, cluster, user, q)
        return int(self.conn.execute(f"SELECT COUNT(*) FROM runs{where}", args).fetchone()[0])

    def delete_run(self, run_id: str, *, unpublish: Callable[[], None] | None = None) -> bool:
        """Forget a run; its resumptions and events go with it (ON DELETE CASCADE). `unpublish` (moving
        the run's folder out of the way) runs inside the transaction: once the name is free again, a new
        run of that name may write its folder, which a late removal of the old one must not reach."""
        with self.write() as c:
            deleted = c.execute("DELETE FROM runs WHERE id = ?", (run_id,)).rowcount > 0
            if deleted and unpublish:
                unpublish()
            return deleted

    def update_run(self, run_id: str, **fields: Any) -> None:
        fields.setdefault("updated", time.time())
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self.write() as c:
            c.execute(f"UPDATE runs SET {sets} WHERE id = ?",
                      (*(encode(v, k) for k, v in fields.items()), run_id))

    def edit_spec(self, run_id: str, edit: Callable[[dict[str, Any]], dict[str, Any] | None],
                  publish: Callable[[dict[str, Any]], None]) -> bool:
        """Replace a run's stored spec by `edit(stored spec)` (None: nothing to change) and write it out by
        `publish`, in one transaction: edits made at once apply one after the other, each to the spec the
        one before stored, so none is lost, and the published spec is the stored one. False if the run
        is gone or nothing changed."""
        with self.write() as c:
            row = c.execute("SELECT spec FROM runs WHERE id = ?", (run_id,)).fetchone()
            spec = edit(json.loads(row[0])) if row else None
            if spec is None:
                return False
            c.execute("UPDATE runs SET spec = ?, updated = ? WHERE id = ?", (json.dumps(spec), time.time(), run_id))
            publish(spec)
            return True

    def request(self, run_id: str, request: str | None, arg: str | None = None) -> None:
        """Ask the supervisor to stop, move or restart a run (it acts on its next pass)."""
        self.update_run(run_id, request=request, request_arg=arg)

    # --- resumptions ------------------------------------------------------------------------------

    def add_resumption(self, res: ResumptionRecord) -> None:
        data = {k: encode(v, k) for k, v in res.__dict__.items()}
        with self.write() as c:
            c.execute(f"INSERT INTO resumptions ({', '.join(data)}) VALUES ({', '.join('?' * len(data))})",
                      tuple(data.values()))

    def update_resumption(self, run_id: str, idx: int, **fields: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self.write() as c:
            c.execute(f"UPDATE resumptions SET {sets} WHERE run_id = ? AND idx = ?",
                      (*(encode(v, k) for k, v in fields.items()), run_id, idx))

    def record_submission(self, run_id: str, idx: int, handle: dict[str, Any]) -> None:
        """The job of a SUBMITTING resumption exists: store its handle and queue the run, in one
        transaction (a crash between the two would leave a PENDING run whose job nobody watches)."""
        with self.write() as c:
            c.execute("UPDATE resumptions SET status = ?, job_id = ?, handle = ?, nodes = ? WHERE run_id = ? "
                      "AND idx = ?", (QUEUED, str(handle.get("job_id")), json.dumps(handle),
                                      json.dumps(list(handle.get("nodes") or [])), run_id, idx))
            c.execute("UPDATE runs SET status = ?, next_cause = NULL, not_before = NULL, updated = ? WHERE id = ?",
                      (QUEUED, time.time(), run_id))

    def delete_resumption(self, run_id: str, idx: int) -> None:
        """Forget a SUBMITTING resumption whose job was never created."""
        with self.write() as c:
            c.execute("DELETE FROM resumptions WHERE run_id = ? AND idx = ?", (run_id, idx))

    def resumptions(self, run_id: str) -> list[ResumptionRecord]:
        rows = self.conn.execute("SELECT * FROM resumptions WHERE run_id = ? ORDER BY idx", (run_id,))
        return [from_row(ResumptionRecord, r) for r in rows]

    def resumptions_of(self, run_ids: list[str]) -> dict[str, list[ResumptionRecord]]:
        """The resumptions of many runs in a few queries (a page of `run list`, not one query per run)."""
        return self._records_of(ResumptionRecord, "resumptions", run_ids, "run_id, idx")

    def current_resumption(self, run_id: str) -> ResumptionRecord | None:
        row = self.conn.execute("SELECT * FROM resumptions WHERE run_id = ? ORDER BY idx DESC LIMIT 1",
                                (run_id,)).fetchone()
        return from_row(ResumptionRecord, row) if row else None

    # --- events -----------------------------------------------------------------------------------

    def add_event(self, run_id: str, kind: str, message: str, data: dict[str, Any] | None = None,
                  at: float | None = None) -> None:
        """Record an event; dropped if the run was deleted meanwhile (a supervisor pass that just ended
        it may still write one, and a foreign-key error there would stop the supervisor)."""
        with self.write() as c:
            c.execute("INSERT INTO events (run_id, time, kind, message, data) SELECT ?, ?, ?, ?, ? "
                      "WHERE EXISTS (SELECT 1 FROM runs WHERE id = ?)",
                      (run_id, at or time.time(), kind, message, json.dumps(data) if data else None, run_id))

    def events(self, run_id: str, after_id: int = 0) -> list[EventRecord]:
        rows = self.conn.execute("SELECT * FROM events WHERE run_id = ? AND id > ? ORDER BY id",
                                 (run_id, after_id))
        return [from_row(EventRecord, r) for r in rows]

    def events_of(self, run_ids: list[str]) -> dict[str, list[EventRecord]]:
        """The events of many runs in a few queries (see `resumptions_of`)."""
        return self._records_of(EventRecord, "events", run_ids, "run_id, id")

    def _records_of(self, cls: type, table: str, run_ids: list[str], order: str) -> dict[str, list[Any]]:
        """run id -> its rows of `table`, queried in chunks under SQLite's limit on bound variables."""
        out: dict[str, list[Any]] = {i: [] for i in run_ids}
        for start in range(0, len(run_ids), _CHUNK):
            chunk = run_ids[start:start + _CHUNK]
            for row in self.conn.execute(f"SELECT * FROM {table} WHERE run_id IN ({', '.join('?' * len(chunk))}) "
                                         f"ORDER BY {order}", chunk):
                out[row["run_id"]].append(from_row(cls, row))
        return out

    # --- nodes ------------------------------------------------------------------------------------

    def record_node_fault(self, cluster: str, node: str, reason: str, *, exclude_after: int = 2,
                          hard: bool = False) -> tuple[int, bool]:
        """Count a failure implicating `node`; it is excluded at `exclude_after` faults, or at once when
        the scheduler itself reported the node failed (`hard`). Returns (faults, excluded)."""
        with self.write() as c:
            row = c.execute("SELECT faults FROM node_faults WHERE cluster = ? AND node = ?",
                            (cluster, node)).fetchone()
            faults = (row[0] if row else 0) + 1
            excluded = hard or faults >= exclude_after
            c.execute("INSERT OR REPLACE INTO node_faults VALUES (?, ?, ?, ?, ?, ?)",
                      (cluster, node, faults, int(excluded), reason, time.time()))
        return faults, excluded

    def node_faults(self, cluster: str) -> list[dict[str, Any]]:
        rows = self.conn.execute("SELECT * FROM node_faults WHERE cluster = ? ORDER BY node", (cluster,))
        return [dict(r) for r in rows]

    def excluded_nodes(self, cluster: str) -> list[str]:
        rows = self.conn.execute("SELECT node FROM node_faults WHERE cluster = ? AND excluded = 1 ORDER BY node",
                                 (cluster,))
        return [r[0] for r in rows]

    def clear_node(self, cluster: str, node: str) -> bool:
        with self.write() as c:
            return c.execute("DELETE FROM node_faults WHERE cluster = ? AND node = ?",
                             (cluster, node)).rowcount > 0

    # --- supervisor -------------------------------------------------------------------------------

    def supervisor_beat(self, pid: int, started: float) -> None:
        with self.write() as c:
            c.execute("INSERT OR REPLACE INTO supervisor (id, pid, started, beat) VALUES (1, ?, ?, ?)",
                      (pid, started, time.time()))
