"""Admin-only (403 otherwise): teams, users and keys, as `tessera server admin ...` does on the host."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Path, Response

from tessera.platform.api.models import KeyMade, NewTeam, NewUser, TeamMade, UserInfo, UserList, UserMade
from tessera.platform.server.accounts import PREFIX_CHARS
from tessera.platform.server.auth import AdminUser, State
from tessera.platform.server.params import UserName

router = APIRouter(prefix="/admin", tags=["admin"])
KeyPrefix = Annotated[str, Path(min_length=PREFIX_CHARS, max_length=PREFIX_CHARS, pattern=r"^tsk_[A-Za-z0-9_-]+$")]


@router.get("/users")
def list_users(who: AdminUser, state: State) -> UserList:
    return UserList(users=[UserInfo.model_validate(asdict(u)) for u in state.accounts.list_users()],
                    teams=state.accounts.list_teams())


@router.post("/teams", status_code=201)
def create_team(body: NewTeam, who: AdminUser, state: State) -> TeamMade:
    with state.audit.change(who, "team create", body.name):
        state.accounts.create_team(body.name)
    return TeamMade(name=body.name)


@router.post("/users", status_code=201)
def create_user(body: NewUser, who: AdminUser, state: State) -> UserMade:
    """The answer holds the user's API key: the only time it is shown."""
    with state.audit.change(who, "user create", body.name, f"team {body.team}" + (", admin" if body.admin else "")):
        key = state.accounts.create_user(body.name, body.team, admin=body.admin)
    return UserMade(name=body.name, team=body.team, admin=body.admin, api_key=key)


@router.post("/users/{name}/keys", status_code=201)
def new_key(name: UserName, who: AdminUser, state: State) -> KeyMade:
    with state.audit.change(who, "key create", name) as entry:
        key = state.accounts.new_key(name)
        entry.detail = f"prefix {key[:PREFIX_CHARS]}"
    return KeyMade(name=name, api_key=key)


@router.delete("/keys/{prefix}", status_code=204, response_class=Response)
def revoke_key(prefix: KeyPrefix, who: AdminUser, state: State) -> Response:
    with state.audit.change(who, "key revoke", prefix, f"prefix {prefix}") as entry:
        entry.target = state.accounts.revoke_key(prefix)   # the key's user
    return Response(status_code=204)
