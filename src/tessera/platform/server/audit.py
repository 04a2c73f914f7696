"""The audit log: one entry per change made through the API (runs, secrets, clusters, accounts).

A change and its entry live in two databases (a team's state.db, the server's SQL database), so they
cannot commit in one transaction. The entry is therefore written first: committed as *pending* before the
change starts, marked done once the change is made, before the answer goes out. A `kill -9` at any point
leaves no change, or a change with its pending entry: never an acknowledged change without one.

`settle_pending` decides every pending entry at the server's start (the server that wrote it is gone). A
submit or clone carries the id of the run it makes (`ref`, chosen before the run exists): its entry stays
if that run exists and is dropped if it does not, so each run made has exactly one entry. Any other
pending entry stays, its detail saying the outcome is unconfirmed. During a request the same rule
applies when the change fails: a refusal (a 4xx answer: nothing was changed) drops the entry, an
unexpected error keeps it as unconfirmed. Listings never show pending entries.

This settles the entries of a dead server at start, so it assumes one server per database.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from tessera.platform.errors import PlatformError
from tessera.platform.server.accounts import Principal
from tessera.platform.store.models import AuditEntry

MAX_DETAIL = 2000
STOPPED = "unconfirmed: the server stopped during this request"
FAILED = "unconfirmed: the request failed"
# Errors that refuse a change before it is made (the API answers them 4xx).
REFUSALS = (PlatformError, ValueError)
RunExists = Callable[[str, str], bool]   # (team, run id) -> does the team have that run


@dataclass(frozen=True)
class AuditRecord:
    time: float
    user: str
    team: str
    action: str
    target: str
    detail: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class Change:
    """The entry of a change being made; the handler sets `target` or `detail` once it knows the outcome."""
    id: int
    target: str
    detail: str


def _unconfirmed(detail: str, why: str) -> str:
    return f"{detail} ({why})" if detail else f"({why})"


class AuditLog:
    def __init__(self, sessions: sessionmaker[Session], run_exists: RunExists) -> None:
        self.sessions = sessions
        self.run_exists = run_exists

    @contextmanager
    def change(self, who: Principal, action: str, target: str, detail: str = "", *,
               ref: str | None = None) -> Iterator[Change]:
        """Record the change made inside the `with` block: pending before it, done after it. `ref` is the
        id of the run the change makes (submit, clone), which decides the entry if the change fails."""
        with self.sessions.begin() as s:
            entry = AuditEntry(time=time.time(), user=who.user, team=who.team, action=action, target=target[:255],
                               detail=detail[:MAX_DETAIL], pending=True, ref=ref)
            s.add(entry)
            s.flush()
            change = Change(entry.id, target, detail)
        try:
            yield change
        except BaseException as exc:
            if ref is not None:
                self._decide(change.id, self.run_exists(who.team, ref))
            elif isinstance(exc, REFUSALS):
                self._decide(change.id, False)
            else:
                self._done(change, _unconfirmed(change.detail, FAILED))
            raise
        self._done(change, change.detail)

    def _done(self, change: Change, detail: str) -> None:
        with self.sessions.begin() as s:
            s.execute(update(AuditEntry).where(AuditEntry.id == change.id).values(
                pending=False, target=change.target[:255], detail=detail[:MAX_DETAIL]))

    def _decide(self, entry_id: int, made: bool) -> None:
        """Keep the entry of a change that was made, drop the entry of one that was not."""
        with self.sessions.begin() as s:
            if made:
                s.execute(update(AuditEntry).where(AuditEntry.id == entry_id).values(pending=False))
            else:
                s.execute(delete(AuditEntry).where(AuditEntry.id == entry_id))

    def settle_pending(self) -> int:
        """Decide the entries a stopped server left pending (see the module's docstring); how many."""
        with self.sessions() as s:
            pending = [(e.team, e.ref, Change(e.id, e.target, e.detail))
                       for e in s.scalars(select(AuditEntry).where(AuditEntry.pending))]
        for team, ref, change in pending:
            if ref is not None:
                self._decide(change.id, self.run_exists(team, ref))
            else:
                self._done(change, _unconfirmed(change.detail, STOPPED))
        return len(pending)

    def entries(self, team: str | None, limit: int = 100) -> list[AuditRecord]:
        """Newest first; `team=None` is every team's (for an admin). Changes still being made are left out."""
        with self.sessions() as s:
            query = select(AuditEntry).where(AuditEntry.pending.is_(False)).order_by(AuditEntry.id.desc()).limit(limit)
            if team is not None:
                query = query.where(AuditEntry.team == team)
            return [AuditRecord(e.time, e.user, e.team, e.action, e.target, e.detail) for e in s.scalars(query)]
