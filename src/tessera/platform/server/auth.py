"""Authentication as one dependency every router uses: `Authorization: Bearer <key>` or `X-API-Key: <key>`.

`current_user` answers 401 for a missing, unknown or revoked key; `team_platform` gives the caller's
team's Platform, so a handler cannot reach another team's runs; `admin_user` answers 403 for non-admins.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from tessera.platform.api.sdk import Platform
from tessera.platform.server.accounts import Principal
from tessera.platform.server.state import ServerState

_bearer = HTTPBearer(auto_error=False, description="An API key (tsk_...) from `tessera server admin create-user`.")
_header = APIKeyHeader(name="X-API-Key", auto_error=False)


def server_state(request: Request) -> ServerState:
    return request.app.state.server


def current_user(request: Request,
                 bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
                 header: Annotated[str | None, Security(_header)]) -> Principal:
    key = bearer.credentials if bearer else header
    if not key:
        raise HTTPException(401, "missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                            headers={"WWW-Authenticate": "Bearer"})
    who = server_state(request).accounts.verify(key.strip())
    if who is None:
        raise HTTPException(401, "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    return who


CurrentUser = Annotated[Principal, Depends(current_user)]
State = Annotated[ServerState, Depends(server_state)]


def team_platform(who: CurrentUser, state: State) -> Iterator[Platform]:
    """The caller's team's Platform for this request, closed after it."""
    platform = state.teams.open(who.team)
    try:
        yield platform
    finally:
        platform.close()


def admin_user(who: CurrentUser) -> Principal:
    if not who.admin:
        raise HTTPException(403, f"user {who.user!r} is not an admin")
    return who


TeamPlatform = Annotated[Platform, Depends(team_platform)]
AdminUser = Annotated[Principal, Depends(admin_user)]
