"""A run's metric points in the store: one row per object its trainer reported ({"step": n, "loss/train":
x, ...}), ingested by the run's supervisor from what it shipped (supervision/run_pass.py), masked as the
run's logs are. `runs.metrics_next` is where the next ingestion reads on; it moves in the transaction that
adds the rows, fenced by the run's lease, so a point is stored once even across a takeover."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Select, exists, insert, select, tuple_, update

from tessera.platform.store.db import reading
from tessera.platform.store.models import metrics, runs
from tessera.platform.store.state import StateDB

INT32 = 2 ** 31
LAST_ID = INT32 - 1   # metrics.id is a 32-bit integer


def _step(row: dict[str, Any]) -> int | None:
    step = row.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and -INT32 < step < INT32 else None


def add_points(db: StateDB, run_id: str, rows: list[dict[str, Any]], next_position: int) -> None:
    """Store `rows` and move the run's ingestion position to `next_position`, in one transaction."""
    with db.write(run_id) as c:
        if rows:
            c.execute(insert(metrics), [{"run_id": run_id, "step": _step(r), "data": json.dumps(r)} for r in rows])
        c.execute(update(runs).where(runs.c.team == db.team, runs.c.id == run_id).values(metrics_next=next_position))


def read_points(db: StateDB, run_id: str, after: int = 0, limit: int = 10_000) -> tuple[list[dict[str, Any]], int]:
    """(the run's points after point `after`, oldest first, at most `limit`; the point to pass next time)."""
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"metrics position must be an integer >= 0 (the `next` of an earlier answer), got {after!r}")
    with reading(db.engine) as c:    # rows as tuples: a page of 10,000 as mappings took 5x as long
        rows = c.execute(points_query(db.team, run_id, after, limit)).all()
    return [json.loads(data) for _, data in rows], rows[-1][0] if rows else after


def points_query(team: str, run_id: str, after: int, limit: int) -> Select[tuple[int, str]]:
    """(id, data) of the run's points after `after`, the team's run only.

    A range of the (run_id, id) index's keys in its order, not `run_id = ? AND id > ? ORDER BY id`: given
    that, PostgreSQL may walk the primary key in id order and skip the other runs' points, which for a run
    holding a large share of the table reads many times the rows (benchmarks/server_scale.py: 74 ms
    against 4 ms for a page of 10,000 of a run's 100,000 points among 1,000,000; EXPLAIN ANALYZE). The
    team is checked apart (EXISTS), as a join on the run would tell PostgreSQL the same equality."""
    key = tuple_(metrics.c.run_id, metrics.c.id)
    ours = exists().where(runs.c.id == run_id, runs.c.team == team)
    return (select(metrics.c.id, metrics.c.data)
            .where(key > tuple_(run_id, after), key <= tuple_(run_id, LAST_ID), ours)
            .order_by(metrics.c.run_id, metrics.c.id).limit(limit))
