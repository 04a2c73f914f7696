"""Soft delete in the store (migration 0004), on SQLite and on PostgreSQL: a deleted run's record stays,
hidden from every list, count and lookup unless asked for, and its name can be given to a new run (the
unique name per team holds only over runs not deleted). Upgrading a store made at 0003 keeps every run
with its resumptions and events: SQLite rebuilds the runs table for it, which with foreign keys on would
cascade into them."""

from __future__ import annotations

import time

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, func, insert, select

from tessera.platform.errors import RunExists
from tessera.platform.store.db import MIGRATIONS, head, migrate, writing
from tessera.platform.store.models import events, resumptions, runs
from tessera.platform.store.records import ResumptionRecord, columns
from tessera.platform.store.state import COMPLETED, RunRecord, StateDB, new_run_id


def _run(name: str, created: float) -> RunRecord:
    return RunRecord(new_run_id(), name, {"name": name}, COMPLETED, "local", created, created, f"/nowhere/{name}")


def test_upgrading_a_0003_store_keeps_runs_resumptions_and_events(fresh_engine: Engine) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with writing(fresh_engine) as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0003")
    run = _run("kept", 1.0)
    row = {k: v for k, v in columns(run).items() if k != "deleted"}   # 0003 has no such column
    with writing(fresh_engine) as c:
        c.execute(insert(runs).values(team="red", **row))
        c.execute(insert(resumptions).values(**columns(ResumptionRecord(run.id, 0, "local", "submitted", COMPLETED,
                                                                        "/nowhere", 1.0))))
        c.execute(insert(events).values(run_id=run.id, team="red", time=1.0, kind="created", message="m"))

    migrate(fresh_engine)

    with writing(fresh_engine) as c:
        assert c.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == head()
        assert c.execute(select(func.count()).select_from(resumptions)).scalar() == 1
        assert c.execute(select(func.count()).select_from(events)).scalar() == 1
    db = StateDB(fresh_engine, "red")
    assert db.get_run("kept") == run
    assert len(db.resumptions(run.id)) == 1 and [e.kind for e in db.events(run.id)] == ["created"]


def test_a_deleted_runs_name_is_free_and_its_record_is_listed_only_on_request(fresh_engine: Engine) -> None:
    migrate(fresh_engine)
    red, blue = StateDB(fresh_engine, "red"), StateDB(fresh_engine, "blue")
    first, other = _run("same", 1.0), _run("same", 1.5)
    red.insert_run(first)
    blue.insert_run(other)
    with pytest.raises(RunExists):
        red.insert_run(_run("same", 1.7))
    before = time.time()
    assert red.delete_run(first.id, soft=True) is True
    assert red.delete_run(first.id, soft=True) is False and red.delete_run(first.id) is False   # already deleted
    assert red.get_run("same") is None and red.get_run(first.id) is None
    deleted = red.get_run(first.id, include_deleted=True)
    assert deleted is not None and deleted.deleted is not None and deleted.deleted >= before

    second = _run("same", 2.0)
    red.insert_run(second)                               # the name is free again
    with pytest.raises(RunExists):
        red.insert_run(_run("same", 2.5))                # but only once
    assert red.delete_run(second.id, soft=True) is True
    third = _run("same", 3.0)
    red.insert_run(third)                                # two deleted runs share the name

    assert [r.id for r in red.list_runs()] == [third.id]
    assert red.count_runs() == 1 and red.count_runs(include_deleted=True) == 3
    page, cursor = red.page_runs(include_deleted=True, limit=2)
    rest, end = red.page_runs(include_deleted=True, cursor=cursor, limit=2)
    assert [r.id for r in page + rest] == [third.id, second.id, first.id] and end is None
    assert [r.deleted is None for r in page + rest] == [True, False, False]
    assert red.get_run("same").id == third.id and red.get_run("same", include_deleted=True).id == third.id
    assert [r.id for r in blue.list_runs()] == [other.id]   # the other team's run of that name is untouched
