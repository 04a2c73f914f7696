"""The audit log: one row per mutating request (submit, stop, move, delete, secret and cluster changes)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tessera.platform.server.accounts import Principal
from tessera.platform.server.models import AuditEntry

MAX_DETAIL = 2000


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


class AuditLog:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def record(self, who: Principal, action: str, target: str, detail: str = "") -> None:
        with self.sessions.begin() as s:
            s.add(AuditEntry(time=time.time(), user=who.user, team=who.team, action=action,
                             target=target[:255], detail=detail[:MAX_DETAIL]))

    def entries(self, team: str | None, limit: int = 100) -> list[AuditRecord]:
        """Newest first; `team=None` is every team's (for an admin)."""
        with self.sessions() as s:
            query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
            if team is not None:
                query = query.where(AuditEntry.team == team)
            return [AuditRecord(e.time, e.user, e.team, e.action, e.target, e.detail) for e in s.scalars(query)]
