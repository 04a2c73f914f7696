"""The SQLite control plane: WAL, and safe for several processes writing at once."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from tessera.platform.errors import RunExists
from tessera.platform.store.state import PENDING, RunRecord, StateDB, new_run_id


def _writer(home: str, run_id: str, count: int) -> None:
    db = StateDB(home)
    for i in range(count):
        db.add_event(run_id, "tick", f"event {i}")
        db.update_run(run_id, retries_used=i)


def test_wal_and_concurrent_writers(tmp_path: Path) -> None:
    db = StateDB(tmp_path)
    assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert (tmp_path / "state.db").stat().st_mode & 0o077 == 0
    run = RunRecord(new_run_id(), "r", {"name": "r"}, PENDING, "local", time.time(), time.time(), str(tmp_path))
    db.insert_run(run)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), run.id, 100)) for _ in range(3)]
    for p in procs:
        p.start()
    for _ in range(100):                       # a reader alongside never blocks or sees a torn state
        assert db.get_run("r").status == PENDING
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(db.events(run.id)) == 300


def test_node_faults_exclude_after_two_or_at_once_when_hard(tmp_path: Path) -> None:
    db = StateDB(tmp_path)
    assert db.record_node_fault("c", "n1", "crash") == (1, False)
    assert db.excluded_nodes("c") == []
    assert db.record_node_fault("c", "n1", "crash") == (2, True)
    assert db.record_node_fault("c", "n2", "NODE_FAIL", hard=True) == (1, True)
    assert db.excluded_nodes("c") == ["n1", "n2"] and db.excluded_nodes("other") == []
    assert db.clear_node("c", "n1") and db.excluded_nodes("c") == ["n2"]


def test_a_name_taken_between_check_and_insert_is_a_run_exists_error(tmp_path: Path) -> None:
    """Two submissions of one name that both passed the SDK's check: the database's unique name decides,
    and the loser gets RunExists (409 through the server), not an sqlite error."""
    with StateDB(tmp_path) as db:
        now = time.time()
        db.insert_run(RunRecord(new_run_id(), "twin", {"name": "twin"}, PENDING, "local", now, now, str(tmp_path)))
        with pytest.raises(RunExists, match="'twin' exists"):
            db.insert_run(RunRecord(new_run_id(), "twin", {"name": "twin"}, PENDING, "local", now, now,
                                    str(tmp_path)))
        assert [r.name for r in db.list_runs()] == ["twin"]
