"""How the store reads at scale (benchmarks/server_scale.py measures it; these check the mechanisms, never
timings): a page of runs, a run and a run's description each take one connection from the pool; the
filtered list indexes cover only live runs (migration 0005, which also goes back down); a run's metric
points are read through the (run_id, id) index even when the run holds most of the table's points, where
PostgreSQL would otherwise walk the primary key and skip the other runs' points."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, event, insert, text
from sqlalchemy.dialects import postgresql

from tessera.platform.api.sdk import Platform
from tessera.platform.store.db import MIGRATIONS, migrate, writing
from tessera.platform.store.metric_points import points_query, read_points
from tessera.platform.store.models import metrics, runs
from tessera.platform.store.records import RunRecord, columns
from tessera.platform.store.state import StateDB

PARTIAL = ("ix_runs_team_status_created", "ix_runs_team_user_created")


@pytest.fixture
def engine(fresh_engine: Engine) -> Engine:
    """A migrated store (SQLite, then PostgreSQL: conftest's fresh_engine)."""
    migrate(fresh_engine)
    return fresh_engine


def _index_sql(engine: Engine) -> dict[str, str]:
    query = ("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'"
             if engine.dialect.name == "sqlite" else "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'runs'")
    with engine.connect() as c:
        return {name: sql or "" for name, sql in c.exec_driver_sql(query)}


def test_the_filtered_list_indexes_hold_live_runs_only_and_go_back_down(engine: Engine) -> None:
    partial = {name: "deleted IS NULL" in sql.replace("(deleted IS NULL)", "deleted IS NULL")
               for name, sql in _index_sql(engine).items() if name.startswith("ix_runs_team")}
    assert partial == {"ix_runs_team_created": False, **dict.fromkeys(PARTIAL, True)}
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with writing(engine) as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0004")
    assert not any("deleted" in sql for name, sql in _index_sql(engine).items() if name in PARTIAL)


def test_a_page_a_run_and_a_description_each_take_one_connection(engine: Engine, tmp_path: Path) -> None:
    platform = Platform(tmp_path / "home", engine=engine, team="red", supervise=lambda: None)
    for i in range(3):
        platform.create_run({"name": f"run-{i}", "command": "true"}, supervise=False)
    checkouts: list[object] = []
    event.listen(engine, "checkout", lambda *_: checkouts.append(1))
    page = platform.run_page(limit=2)
    assert (len(page.items), page.total, len(checkouts)) == (2, 3, 1)
    assert platform.get_run("run-1").name == "run-1" and len(checkouts) == 2
    assert platform.describe_run("run-2")["name"] == "run-2"
    assert len(checkouts) == 4        # the secrets for its redactor, then the run with its lease


def _points(engine: Engine) -> dict[str, list[int]]:
    """20,000 points of 20 runs in batches of 100 as runs training at once report them, run r00 holding half
    of them; their steps by run."""
    ids = [f"r{i:02d}" for i in range(20)]
    steps: dict[str, list[int]] = {run_id: [] for run_id in ids}
    rows = []
    for batch in range(200):
        run_id = "r00" if batch % 2 else ids[1 + batch % 19]
        first = len(steps[run_id])
        steps[run_id] += range(first, first + 100)
        rows += [{"run_id": run_id, "step": s, "data": json.dumps({"step": s})} for s in range(first, first + 100)]
    with writing(engine) as c:
        for i, run_id in enumerate(ids):
            record = RunRecord(run_id, f"run-{i}", {}, "COMPLETED", "local", 1.0, 1.0, "/nowhere")
            c.execute(insert(runs).values(team="red", **columns(record)))
        c.execute(insert(metrics), rows)
    return steps


def test_a_runs_points_are_read_in_the_order_of_its_index(engine: Engine) -> None:
    steps = _points(engine)
    db = StateDB(engine, "red")
    for run_id in ("r00", "r07"):
        got, after = [], 0
        while True:
            rows, after = read_points(db, run_id, after, limit=3000)
            if not rows:
                break
            got += [row["step"] for row in rows]
        assert got == steps[run_id]
    assert read_points(StateDB(engine, "blue"), "r00") == ([], 0)
    if engine.dialect.name == "postgresql":
        with psycopg.connect(engine.url.render_as_string(hide_password=False).replace("+psycopg", ""),
                             autocommit=True) as pg:
            pg.execute("VACUUM ANALYZE metrics")   # the statistics under which the primary key looked cheaper
        query = points_query("red", "r00", 0, 10_000)
        sql = str(query.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
        with engine.connect() as c:
            plan = "\n".join(c.execute(text(f"EXPLAIN {sql}")).scalars())
        assert "ix_metrics_run" in plan and "metrics_pkey" not in plan, plan
