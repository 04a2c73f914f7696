"""Importing the state an older version kept in a raw SQLite file: a home's `state.db` (the standalone
CLI's `$TESSERA_HOME/state.db`, or a server's `teams/<team>/state.db`), at `PRAGMA user_version` 1 to 3.

Every row of its clusters, runs, resumptions, events and node faults is copied into the store as the
team's, in one transaction, and the settings table records that this file was imported, so it is done
once (the old file is left where it is, untouched). Columns are read by name, so every old version is read
alike: what a version lacks (version 1 has no `runs.user`) takes its default. A run whose id the team has
already is skipped (nothing is imported twice); one whose id another team's run has gets a new id (ids
are unique in the store, they were only per home); one whose name the team already uses for another run
is kept under the name plus its id, so no run is lost.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Table, insert, select

from tessera.platform.errors import PlatformError
from tessera.platform.store.db import writing
from tessera.platform.store.meta import get_setting, put_setting
from tessera.platform.store.models import clusters, events, node_faults, resumptions, runs
from tessera.platform.store.records import new_run_id

STATE_FILE = "state.db"
BATCH = 500


def imported_key(team: str, path: Path) -> str:
    return f"imported:{team}:{path.resolve()}"


def import_state_db(engine: Engine, path: Path, team: str) -> int | None:
    """Import the old state file `path` into `team`, unless it was imported before (None then); returns
    how many runs it brought. A file that is not an old state database raises ValueError naming it."""
    key = imported_key(team, path)
    if get_setting(engine, key) is not None:
        return None
    old = _open(path)
    try:
        with writing(engine) as c:
            if get_setting(c, key) is not None:     # another process imported it meanwhile
                return None
            _no_old_supervisor(path.parent)
            count = _copy(old, c, team)
            put_setting(c, key, f"{time.time()} {count} runs")
    finally:
        old.close()
    return count


class OldSupervisorRunning(PlatformError):
    """A supervisor of the older version still drives the home's runs from its state.db."""


def _no_old_supervisor(home: Path) -> None:
    """Refuse to import a home whose old supervisor runs (it holds `supervisor.lock`): it would go on
    driving the runs from the old file while this version's supervisor drives them from the store. Only
    an old one can hold the lock here: the home's new supervisor starts after its import."""
    lock = home / "supervisor.lock"
    if not lock.exists():
        return
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = (home / "supervisor.pid").read_text().strip() if (home / "supervisor.pid").exists() else "?"
        raise OldSupervisorRunning(
            f"{home} is supervised by the supervisor of an older Tessera (pid {pid}); stop it (`kill {pid}`: its "
            "runs keep going) and run this again, so that its runs move to the new store with one supervisor") from None
    finally:
        os.close(fd)   # closing the descriptor releases the lock, if it was taken


def _open(path: Path) -> sqlite3.Connection:
    try:
        old = sqlite3.connect(path, timeout=30.0)
        old.row_factory = sqlite3.Row
        version = old.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in old.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{path} is not a Tessera state database: {exc}") from None
    if not 1 <= version <= 3 or "runs" not in tables:
        old.close()
        raise ValueError(f"{path} is not a Tessera state database of versions 1-3 (user_version {version}, "
                         f"tables: {', '.join(sorted(tables)) or 'none'})")
    return old


def _rows(old: sqlite3.Connection, table: str, order: str) -> Iterator[dict[str, Any]]:
    have = {r[0] for r in old.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if table in have:
        for row in old.execute(f"SELECT * FROM {table} ORDER BY {order}"):
            yield dict(row)


def _insert(c: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    names = set(table.c.keys())
    rows = [{k: v for k, v in row.items() if k in names} for row in rows]
    for start in range(0, len(rows), BATCH):
        c.execute(insert(table), rows[start:start + BATCH])


def _copy(old: sqlite3.Connection, c: Connection, team: str) -> int:
    ours = set(c.execute(select(runs.c.id).where(runs.c.team == team)).scalars())
    others = set(c.execute(select(runs.c.id).where(runs.c.team != team)).scalars())
    # a deleted run's name is free (the unique name is over runs not deleted): only live runs' names are taken
    taken_names = set(c.execute(select(runs.c.name).where(runs.c.team == team, runs.c.deleted.is_(None))).scalars())
    new_runs, ids = [], {}
    for row in _rows(old, "runs", "created, rowid"):
        if row["id"] in ours:                      # this run is in the team already
            continue
        ids[row["id"]] = new_run_id() if row["id"] in others else row["id"]   # ids are unique across teams
        if row["name"] in taken_names:
            row["name"] = f"{row['name']}-{row['id']}"
        taken_names.add(row["name"])
        new_runs.append({**row, "id": ids[row["id"]], "team": team, "user": row.get("user"), "metrics_next": 0})
    _insert(c, runs, new_runs)
    _insert(c, resumptions, [{**r, "run_id": ids[r["run_id"]]} for r in _rows(old, "resumptions", "run_id, idx")
                             if r["run_id"] in ids])
    _insert(c, events, [{**{k: v for k, v in r.items() if k != "id"}, "run_id": ids[r["run_id"]], "team": team}
                        for r in _rows(old, "events", "id") if r["run_id"] in ids])
    have_clusters = set(c.execute(select(clusters.c.name).where(clusters.c.team == team)).scalars())
    _insert(c, clusters, [{**r, "team": team} for r in _rows(old, "clusters", "name") if r["name"] not in have_clusters])
    have_nodes = set(c.execute(select(node_faults.c.cluster, node_faults.c.node).where(node_faults.c.team == team)).all())
    _insert(c, node_faults, [{**r, "team": team} for r in _rows(old, "node_faults", "cluster, node")
                             if (r["cluster"], r["node"]) not in have_nodes])
    return len(new_runs)
