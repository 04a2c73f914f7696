"""The audit log: one entry per change made through the API (runs, secrets, clusters, accounts).

A change and its entry commit in one transaction of the store (store/audit.py): the handler announces
the change (`change`), the store's first write of it carries the entry, and a change that was refused
leaves none. So every acknowledged change has exactly one entry, also across a `kill -9` of the server
at any point, with no entry ever pending and nothing to settle at the next start.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

from tessera.platform.server.accounts import Principal
from tessera.platform.store.audit import AuditNote, AuditRecord, noting, page_entries, settle
from tessera.platform.store.paging import Page

__all__ = ["AuditLog", "AuditNote", "AuditRecord"]


class AuditLog:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def change(self, who: Principal, action: str, target: str, detail: str = "") -> Iterator[AuditNote]:
        """Record the change made inside the `with` block, in its own transaction; the handler may set the
        entry's `target` and `detail` once it knows the outcome."""
        note = AuditNote(who.user, who.team, action, target, detail)
        with noting(note):
            yield note
        settle(self.engine, note)

    def page(self, team: str | None, *, user: str | None = None, action: str | None = None,
             target: str | None = None, cursor: str | None = None, limit: int = 50) -> Page[AuditRecord]:
        """A page of entries newest first, filtered (store/audit.py's page_entries)."""
        return page_entries(self.engine, team, user=user, action=action, target=target, cursor=cursor, limit=limit)
