"""Replicas taking leases at the same moment (store/leases.py), on SQLite and on PostgreSQL (conftest's
fresh_engine): each free run and each expired lease goes to exactly one of them, with one new token, and a
loser's fenced write is refused. test_state.py checks the lease rules one call at a time; this checks them
with the callers racing (on PostgreSQL the expired rows are locked FOR UPDATE SKIP LOCKED: without a lock
two replicas would both read a lease as expired and both take it)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from tessera.platform.store.db import migrate, writing
from tessera.platform.store.leases import Fence, Lease, StaleLease, acquire
from tessera.platform.store.models import run_leases
from tessera.platform.store.state import RUNNING, RunRecord, StateDB, new_run_id

RUNS = 40
REPLICAS = 4


def _race(engine: Engine) -> dict[str, list[Lease]]:
    """Every replica's `acquire`, released together by a barrier."""
    barrier = threading.Barrier(REPLICAS)

    def take(owner: str) -> list[Lease]:
        barrier.wait()
        return acquire(engine, owner, seconds=30)
    owners = [f"r{k}" for k in range(REPLICAS)]
    with ThreadPoolExecutor(REPLICAS) as pool:
        return dict(zip(owners, pool.map(take, owners), strict=True))


def _holders(taken: dict[str, list[Lease]], ids: list[str]) -> dict[str, str]:
    """run id -> the replica that took it; each run taken once, none twice."""
    leases = [lease for held in taken.values() for lease in held]
    assert sorted(lease.run_id for lease in leases) == sorted(ids)
    return {lease.run_id: owner for owner, held in taken.items() for lease in held}


def test_replicas_taking_leases_at_once_take_each_run_once(fresh_engine: Engine, tmp_path: Path) -> None:
    migrate(fresh_engine)
    db = StateDB(fresh_engine, "red")
    now = time.time()
    ids = [new_run_id() for _ in range(RUNS)]
    for i, run_id in enumerate(ids):
        db.insert_run(RunRecord(run_id, f"run-{i:02d}", {"name": f"run-{i:02d}"}, RUNNING, "local", now + i, now,
                                str(tmp_path)))
    first = _race(fresh_engine)                                        # runs nobody holds yet
    before = _holders(first, ids)
    assert {lease.run_id: (lease.token, lease.previous) for held in first.values() for lease in held} == \
        dict.fromkeys(ids, (1, None))
    with writing(fresh_engine) as c:                                   # their holders stop renewing them
        c.execute(update(run_leases).values(expires=0.0))
    second = _race(fresh_engine)                                       # expired leases
    after = _holders(second, ids)
    assert {lease.run_id: (lease.token, lease.previous) for held in second.values() for lease in held} == {
        run_id: (2, None if after[run_id] == before[run_id] else before[run_id]) for run_id in ids}

    run_id = ids[0]
    loser = next(owner for owner in second if owner != after[run_id])
    with pytest.raises(StaleLease, match=f"held by {after[run_id]} "):
        StateDB(fresh_engine, "red", fence=Fence(loser, {run_id: 2})).update_run(run_id, retries_used=1)
    StateDB(fresh_engine, "red", fence=Fence(after[run_id], {run_id: 2})).update_run(run_id, retries_used=1)
    assert db.get_run(run_id).retries_used == 1
