"""Who the caller is, and what their team did (the audit log)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from tessera.platform.server.auth import CurrentUser, State
from tessera.platform.server.params import Limit

router = APIRouter(tags=["account"])


@router.get("/whoami")
def whoami(who: CurrentUser) -> dict[str, Any]:
    return {"user": who.user, "team": who.team, "admin": who.admin}


@router.get("/audit")
def audit(who: CurrentUser, state: State, limit: Limit = 100) -> dict[str, Any]:
    """The caller's team's entries, newest first."""
    return {"entries": [e.to_dict() for e in state.audit.entries(who.team, limit)]}
