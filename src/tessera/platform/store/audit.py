"""The audit log's rows: who did what to which object, written in the transaction of the change itself.

A change made through the API is announced first (`noting`: the entry it will leave, held in a context
variable of the request), then made by the store's ordinary methods. The first write transaction of the
change carries the entry (`carrying`, which every write of the store goes through: `transaction`), so the
change and its entry commit together or not at all: a `kill -9` at any point leaves neither or both, and
a refused change (a name taken, a run not found) leaves no entry. A change that wrote nothing (stopping a
run that had ended) has its entry written on its own when it returns (server/audit.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass

from sqlalchemy import Connection, Engine, insert, select, update

from tessera.platform.store.db import reading, writing
from tessera.platform.store.models import audit
from tessera.platform.store.paging import Page, decode_cursor, encode_cursor

MAX_DETAIL = 2000


@dataclass
class AuditNote:
    """The entry of a change being made; `id` is set once a transaction has written it. The handler may
    change `target` and `detail` once it knows the outcome (they are updated after the change)."""
    user: str
    team: str
    action: str
    target: str
    detail: str = ""
    id: int | None = None
    written: tuple[str, str] | None = None     # (target, detail) as written


@dataclass(frozen=True)
class AuditRecord:
    time: float
    user: str
    team: str
    action: str
    target: str
    detail: str
    id: int = 0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


_note: ContextVar[AuditNote | None] = ContextVar("tessera_audit_note", default=None)


@contextmanager
def noting(note: AuditNote) -> Iterator[AuditNote]:
    """Within this block, the first write transaction of the store carries `note`."""
    token = _note.set(note)
    try:
        yield note
    finally:
        _note.reset(token)


@contextmanager
def not_noting() -> Iterator[None]:
    """Within this block, no write carries the change's note: for the steps a change takes on its way
    (a delete stops the run first) whose own writes must not stand for the change if it is then refused
    (four racing deletes: each loser's stop request would otherwise have committed a 'delete' entry)."""
    token = _note.set(None)
    try:
        yield
    finally:
        _note.reset(token)


def _values(note: AuditNote) -> dict[str, object]:
    return {"target": note.target[:255], "detail": note.detail[:MAX_DETAIL]}


def write_note(connection: Connection, note: AuditNote) -> None:
    note.id = connection.execute(insert(audit).values(time=time.time(), user=note.user, team=note.team,
                                                      action=note.action, **_values(note))
                                 .returning(audit.c.id)).scalar_one()
    note.written = (note.target, note.detail)


@contextmanager
def carrying() -> Iterator[Callable[[Connection], None]]:
    """Around a write transaction (its commit included): yields the function that writes the pending note
    (if any, and not yet written) into the transaction once it is open. If the transaction fails, at any
    point up to its commit, the note is pending again (a later transaction of the change carries it)."""
    note = _note.get()
    fresh = note is not None and note.id is None

    def carry(connection: Connection) -> None:
        if fresh:
            assert note is not None
            write_note(connection, note)

    try:
        yield carry
    except BaseException:
        if fresh:
            assert note is not None
            note.id, note.written = None, None
        raise


@contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """A write transaction of the store: it carries the audit note of the change being made."""
    with carrying() as carry, writing(engine) as connection:
        carry(connection)
        yield connection


def settle(engine: Engine, note: AuditNote) -> None:
    """After a change that succeeded: write its entry if no transaction did (it changed nothing stored),
    or bring the written one's target and detail up to date."""
    if note.id is None:
        with writing(engine) as connection:
            write_note(connection, note)
    elif note.written != (note.target, note.detail):
        with writing(engine) as connection:
            connection.execute(update(audit).where(audit.c.id == note.id).values(**_values(note)))


def page_entries(engine: Engine, team: str | None, *, user: str | None = None, action: str | None = None,
                 target: str | None = None, cursor: str | None = None, limit: int = 50) -> Page[AuditRecord]:
    """Entries newest first (`team=None`: every team's, for an admin), filtered; a page of `limit` after
    `cursor` (the previous page's `next_cursor`)."""
    query = select(audit).order_by(audit.c.id.desc()).limit(limit + 1)
    for column, value in ((audit.c.team, team), (audit.c.user, user), (audit.c.action, action),
                          (audit.c.target, target)):
        if value is not None:
            query = query.where(column == value)
    if cursor:
        (last,) = decode_cursor(cursor, (int,))
        query = query.where(audit.c.id < last)
    with reading(engine) as connection:
        rows = connection.execute(query).mappings().all()
    entries = [AuditRecord(r["time"], r["user"], r["team"], r["action"], r["target"], r["detail"], r["id"])
               for r in rows[:limit]]
    more = len(rows) > limit
    return entries, encode_cursor(entries[-1].id) if more else None
