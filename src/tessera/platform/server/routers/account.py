"""Who the caller is, and what their team did (the audit log, a page at a time)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tessera.platform.api.models import PAGE, AuditPage, WhoAmI
from tessera.platform.server.auth import CurrentUser, State
from tessera.platform.server.params import Cursor, Limit, UserFilter

router = APIRouter(tags=["account"])
Text = Annotated[str | None, Query(max_length=255)]


@router.get("/whoami")
def whoami(who: CurrentUser) -> WhoAmI:
    return WhoAmI(user=who.user, team=who.team, admin=who.admin)


@router.get("/audit")
def audit(who: CurrentUser, state: State, user: UserFilter, action: Text = None, target: Text = None,
          cursor: Cursor = None, limit: Limit = PAGE) -> AuditPage:
    """The caller's team's entries, newest first, filtered by user, action ("submit", "secret create",
    ...) and target (the object's name); pass `next_cursor` back as `cursor` for the next page."""
    entries, next_cursor = state.audit.page(who.team, user=user, action=action, target=target, cursor=cursor,
                                            limit=limit)
    return AuditPage(items=entries, next_cursor=next_cursor)
