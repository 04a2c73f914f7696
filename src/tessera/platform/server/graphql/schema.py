"""The schema MCLI's client talks to, and the router that serves it on /graphql: queries and mutations as
HTTP POST, subscriptions over a websocket on the same path in either subprotocol (`graphql-transport-ws`,
and the older `graphql-ws` that MCLI's client asks for first).

Field names are MosaicML's API's, set explicitly (getRunLogsV2 would otherwise be spelt by a rule). As
there, `createRun`, `updateRun` and `createSecret` answer a list of one: the client reads every
operation's answer as a list.
Errors the platform raises on purpose (a missing run, a bad spec, a refused key) are answers, not faults:
they are not logged as server errors; anything else is.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

import strawberry
from graphql import GraphQLError
from strawberry.fastapi import GraphQLRouter
from strawberry.types import ExecutionContext

from tessera.platform.server.graphql import clusters, logs, runs, secrets, types, users
from tessera.platform.server.graphql.context import Context, context_of, key_of

PATH = "/graphql"
log = logging.getLogger(__name__)


@strawberry.type
class Query:
    get_clusters: list[types.Cluster] = strawberry.field(name="getClusters", resolver=clusters.get_clusters)
    get_runs_paginated: types.RunsPage = strawberry.field(name="getRunsPaginated", resolver=runs.get_runs_paginated)
    get_runs: list[types.Run] = strawberry.field(name="getRuns", resolver=runs.get_runs)
    get_secrets: list[types.Secret] = strawberry.field(name="getSecrets", resolver=secrets.get_secrets)
    get_users: list[types.User] = strawberry.field(name="getUsers", resolver=users.get_users)


@strawberry.type
class Mutation:
    create_run: list[types.Run] = strawberry.mutation(name="createRun", resolver=runs.create_run)
    stop_runs: list[types.Run] = strawberry.mutation(name="stopRuns", resolver=runs.stop_runs)
    start_runs: list[types.Run] = strawberry.mutation(name="startRuns", resolver=runs.start_runs)
    delete_runs: list[types.Run] = strawberry.mutation(name="deleteRuns", resolver=runs.delete_runs)
    update_run: list[types.Run] = strawberry.mutation(name="updateRun", resolver=runs.update_run)
    create_secret: list[types.Secret] = strawberry.mutation(name="createSecret", resolver=secrets.create_secret)
    delete_secrets: list[types.Secret] = strawberry.mutation(name="deleteSecrets", resolver=secrets.delete_secrets)


@strawberry.type
class Subscription:
    get_run_logs_v2: AsyncGenerator[types.LogChunk, None] = strawberry.subscription(
        name="getRunLogsV2", resolver=logs.get_run_logs_v2)
    watch_run_status: AsyncGenerator[str, None] = strawberry.subscription(
        name="watchRunStatus", resolver=logs.watch_run_status)


class MCLISchema(strawberry.Schema):
    def process_errors(self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None) -> None:
        for found in errors:
            if not (found.extensions or {}).get("code") and not _is_request_error(found):
                log.error("GraphQL operation failed", exc_info=found.original_error or found)


def _is_request_error(found: GraphQLError) -> bool:
    """A query the schema refused (unknown field or argument, wrong type): the client's mistake."""
    return found.original_error is None


SCHEMA = MCLISchema(query=Query, mutation=Mutation, subscription=Subscription)


class MCLIRouter(GraphQLRouter[Context, None]):
    async def on_ws_connect(self, context: Context) -> None:
        """Take the key from connection_init; acknowledge even a bad one (context.py says why)."""
        params = context.connection_params if isinstance(context.connection_params, dict) else None
        context.key = key_of(params) or context.key


def router() -> MCLIRouter:
    return MCLIRouter(SCHEMA, path=PATH, context_getter=context_of, graphql_ide=None, allow_queries_via_get=False,
                      include_in_schema=False)
