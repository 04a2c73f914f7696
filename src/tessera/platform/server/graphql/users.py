"""`getUsers`: the caller, as MCLI's current user (`mcli get runs --all-users` asks for its organization,
which is the caller's team). Listing a team's users is an admin's (`tessera server admin list-users`)."""

from __future__ import annotations

from typing import Any

from strawberry.types import Info

from tessera.platform.server.graphql import types
from tessera.platform.server.graphql.context import Context, error
from tessera.platform.server.graphql.inputs import GetUsersInput


async def get_users(info: Info[Context, Any], get_users_data: GetUsersInput) -> list[types.User]:
    who = await info.context.who()
    if get_users_data.filters:
        raise error("getUsers answers the caller only; an admin lists a team's users with `tessera server admin "
                    "list-users`", 400, "value_invalid")
    team = types.Organization(id=who.team, name=who.team, is_databricks_internal=False)
    return [types.User(id=who.user, name=who.user, email=who.user, organizations=[team])]
