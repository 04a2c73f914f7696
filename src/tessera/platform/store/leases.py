"""Who supervises which run: replicas and run leases, with fencing tokens.

Every process that supervises runs (a server replica's supervision thread, a home's standalone
supervisor) is a replica: a row with its host, pid, boot id and a heartbeat. It supervises a run only
while it holds the run's lease (owner, token, heartbeat, expires). Each pass it renews the leases it
holds, takes a lease on every active run that has none, and takes over the leases that expired: their
owner stopped renewing them, so it died or hangs. On PostgreSQL the expired leases are locked with
`SELECT ... FOR UPDATE SKIP LOCKED`, so replicas taking over at once never wait on or fight over one; on
SQLite a write transaction holds the whole database (`BEGIN IMMEDIATE`).

A lease's token grows by one whenever it changes owner, and is kept when the run ends (the lease is
released, not deleted), so a token is never given out twice for one run. Every write the supervisor makes
about a run checks, inside its own transaction, that it still holds that run's lease with its token
(`Fence.check`, locking the lease row so a takeover waits for the write to commit): a replica that
paused past its lease's expiry and wakes up after another took over has its writes refused (StaleLease),
so no run is ever driven by two replicas at once.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, exists, select, update

from tessera.platform.errors import PlatformError
from tessera.platform.store.db import insert_or_ignore, reading, writing
from tessera.platform.store.models import replicas, run_leases, runs
from tessera.platform.store.records import ACTIVE

DEFAULT_LEASE_SECONDS = 30.0
TAKE_AT_ONCE = 200   # leases taken per pass at most (the rest on the next pass)


class StaleLease(PlatformError):
    """A supervisor wrote about a run whose lease it no longer holds (another replica took it over)."""


def boot_id() -> str:
    """This host's boot id: a pid names the same process only on the same host and the same boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


@dataclass(frozen=True)
class Replica:
    id: str
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    boot_id: str = field(default_factory=boot_id)
    url: str | None = None


@dataclass(frozen=True)
class Lease:
    run_id: str
    team: str
    token: int
    previous: str | None = None    # the owner it was taken over from (None: a new lease, or our own)


@dataclass
class Fence:
    """The leases a supervisor holds (run id -> token); `check` refuses a write about any other run."""
    owner: str
    tokens: dict[str, int] = field(default_factory=dict)

    def check(self, connection: Connection, run_id: str) -> None:
        row = connection.execute(select(run_leases.c.owner, run_leases.c.token)
                                 .where(run_leases.c.run_id == run_id).with_for_update()).first()
        mine = self.tokens.get(run_id)
        if row is None or mine is None or row.owner != self.owner or row.token != mine:
            holder = f"{row.owner or 'nobody'} (token {row.token})" if row else "nobody (the run is gone)"
            raise StaleLease(f"run {run_id}: the lease is held by {holder}, not by replica {self.owner} "
                             f"(token {mine}); its write is refused")


def register(engine: Engine, replica: Replica) -> None:
    """Record (or refresh) the replica's row."""
    now = time.time()
    values = {"host": replica.host, "pid": replica.pid, "boot_id": replica.boot_id, "url": replica.url,
              "started": now, "beat": now}
    with writing(engine) as c:
        if c.execute(update(replicas).where(replicas.c.id == replica.id).values(**values)).rowcount == 0:
            c.execute(replicas.insert().values(id=replica.id, **values))


def hold(engine: Engine, owner: str, seconds: float) -> list[Lease]:
    """A supervision pass's leases, in one transaction: the replica's heartbeat, the leases it holds
    renewed, and the free and expired ones taken (`acquire`). Returns every lease it now holds."""
    now = time.time()
    with writing(engine) as c:
        c.execute(update(replicas).where(replicas.c.id == owner).values(beat=now))
        held = {lease.run_id: lease for lease in _renew(c, owner, seconds, now)}
        held.update({lease.run_id: lease for lease in _acquire(c, owner, seconds, now, TAKE_AT_ONCE)})
    return list(held.values())


def acquire(engine: Engine, owner: str, seconds: float, limit: int = TAKE_AT_ONCE) -> list[Lease]:
    """Take the lease of every active run that has none, and of every active run whose lease expired
    (its owner's included: a replica restarted under the same id takes its own leases back, with a new
    token). Returns the leases taken."""
    with writing(engine) as c:
        return _acquire(c, owner, seconds, time.time(), limit)


def _acquire(c: Connection, owner: str, seconds: float, now: float, limit: int) -> list[Lease]:
    taken: list[Lease] = []
    free = c.execute(select(runs.c.id, runs.c.team).where(
        runs.c.status.in_(ACTIVE), ~exists().where(run_leases.c.run_id == runs.c.id))
        .order_by(runs.c.created, runs.c.id).limit(limit)).all()   # one order for every replica: no deadlock
    for run_id, team in free:
        # unless another replica made the row a moment ago
        if insert_or_ignore(c, run_leases, {"run_id": run_id, "owner": owner, "token": 1, "heartbeat": now,
                                            "expires": now + seconds}, ["run_id"]):
            taken.append(Lease(run_id, team, 1))
    expired = c.execute(select(run_leases.c.run_id, run_leases.c.owner, run_leases.c.token, runs.c.team)
                        .join(runs, runs.c.id == run_leases.c.run_id)
                        .where(runs.c.status.in_(ACTIVE), run_leases.c.expires < now)
                        .order_by(run_leases.c.expires).limit(limit)
                        .with_for_update(skip_locked=True, of=run_leases)).all()
    for run_id, previous, token, team in expired:
        c.execute(update(run_leases).where(run_leases.c.run_id == run_id).values(
            owner=owner, token=token + 1, heartbeat=now, expires=now + seconds))
        taken.append(Lease(run_id, team, token + 1, previous if previous != owner else None))
    return taken


def renew(engine: Engine, owner: str, seconds: float) -> list[Lease]:
    """Extend every lease `owner` still holds; returns them (a lease taken over by another is not)."""
    with writing(engine) as c:
        return _renew(c, owner, seconds, time.time())


def _renew(c: Connection, owner: str, seconds: float, now: float) -> list[Lease]:
    c.execute(update(run_leases).where(run_leases.c.owner == owner).values(heartbeat=now, expires=now + seconds))
    rows = c.execute(select(run_leases.c.run_id, runs.c.team, run_leases.c.token)
                     .join(runs, runs.c.id == run_leases.c.run_id).where(run_leases.c.owner == owner)).all()
    return [Lease(run_id, team, token) for run_id, team, token in rows]


def release(engine: Engine, owner: str, run_ids: list[str] | None = None) -> None:
    """Give up leases, so another replica may take them at once; the row and its token stay, so the next
    owner's token is greater. With `run_ids`: runs that ended, whose lease names no owner any more.
    Without: every lease of a replica shutting down, still naming it, so that the replica taking a run
    over reconciles it with its cluster first (takeover.py): its processes may live, on this host."""
    with writing(engine) as c:
        query = update(run_leases).where(run_leases.c.owner == owner)
        if run_ids is None:
            c.execute(query.values(expires=0.0))
        else:
            c.execute(query.where(run_leases.c.run_id.in_(run_ids)).values(owner=None, expires=0.0))


def lease_of(engine: Engine, run_id: str) -> tuple[str, float] | None:
    """(the replica supervising the run, when its lease expires, or expired: 0 once given up at a
    shutdown), or None when no replica has held it since it last ended."""
    return leases_of(engine, [run_id]).get(run_id)


def leases_of(engine: Engine, run_ids: list[str]) -> dict[str, tuple[str, float]]:
    """`lease_of` of many runs (a page of descriptions) in one query per 500 ids; a run without one is absent."""
    found: dict[str, tuple[str, float]] = {}
    with reading(engine) as c:
        for start in range(0, len(run_ids), 500):
            query = select(run_leases.c.run_id, run_leases.c.owner, run_leases.c.expires).where(
                run_leases.c.run_id.in_(run_ids[start:start + 500]))
            found.update((row.run_id, (row.owner, row.expires)) for row in c.execute(query) if row.owner)
    return found
