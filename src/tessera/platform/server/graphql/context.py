"""Who a GraphQL operation acts as, and how it reaches the caller's team's Platform.

MCLI sends its key as the raw `Authorization` header of each POST (no "Bearer"), and over a websocket in
the `connection_init` payload (`{"Authorization": KEY, ...}`). Both are read here, "Bearer KEY" and
`X-API-Key` too, and checked by the same `Accounts.verify` as the REST API.

A websocket with a bad key is acknowledged and every operation on it then fails with a 401 error. It is
not closed at `connection_init`: MCLI's websocket client reconnects after a refused connection forever
(exponential backoff, no limit), so a closed socket would hang `mcli logs` silently; an error on the
operation ends the command with the message.

Platform calls block (database, files), so each runs in a worker thread; a platform error becomes a
GraphQL error whose `extensions.code` is the HTTP status MCLI reads (`HTTPStatus(code)`) and
`extensions.problem` the stable code of api/problems.py, as the REST API's problem+json.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from graphql import GraphQLError
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from strawberry.fastapi import BaseContext
from strawberry.types import Info

from tessera.platform.api.problems import for_exception
from tessera.platform.api.sdk import Platform
from tessera.platform.server.accounts import Principal
from tessera.platform.server.problems import one_line
from tessera.platform.server.state import ServerState

T = TypeVar("T")
log = logging.getLogger(__name__)
NO_KEY = "missing API key: send it as the Authorization header (MOSAICML_API_KEY for mcli)"
BAD_KEY = "invalid or revoked API key"


def error(message: str, status: int, problem: str) -> GraphQLError:
    return GraphQLError(one_line(message), extensions={"code": status, "problem": problem})


def key_of(values: dict[str, Any] | None) -> str | None:
    """The API key in headers or a connection_init payload: `Authorization: KEY` (MCLI), `Bearer KEY`, or
    `X-API-Key`; names in any case."""
    found = {str(k).lower(): v for k, v in (values or {}).items() if isinstance(v, str)}
    raw = found.get("authorization") or found.get("x-api-key") or ""
    raw = raw.strip()
    if raw.lower().startswith("bearer "):
        raw = raw[7:].strip()
    return raw or None


class Context(BaseContext):
    """One HTTP request's, or one websocket connection's (its key comes with `connection_init`)."""

    def __init__(self, state: ServerState, key: str | None) -> None:
        super().__init__()
        self.state = state
        self.key = key
        self._who: Principal | None = None

    async def who(self) -> Principal:
        """The caller; a 401 error for a missing, unknown or revoked key."""
        if self._who is None:
            if not self.key:
                raise error(NO_KEY, 401, "unauthorized")
            found = await run_in_threadpool(self.state.accounts.verify, self.key)
            if found is None:
                raise error(BAD_KEY, 401, "unauthorized")
            self._who = found
        return self._who


async def context_of(connection: HTTPConnection) -> Context:
    """FastAPI's dependency: the key in the request's headers (a websocket's upgrade request too, though
    MCLI's comes with connection_init, which then takes precedence: schema.py)."""
    return Context(connection.app.state.server, key_of(dict(connection.headers)))


def translated(exc: Exception) -> GraphQLError | None:
    """The GraphQL error of a platform exception (None: not the platform's, a bug to log)."""
    problem = for_exception(exc)
    return None if problem is None else error(str(exc) or problem.title, problem.status, problem.code)


async def call(fn: Callable[[], T]) -> T:
    """`fn()` in a worker thread (the pool the REST routes run in), its platform errors as GraphQL errors."""
    try:
        return await run_in_threadpool(fn)
    except GraphQLError:
        raise
    except Exception as exc:
        found = translated(exc)
        if found is None:     # a fault of the server: logged in full, answered without its internals
            log.exception("GraphQL operation failed")
            found = error("the server failed; its log has the details", 500, "internal_error")
        raise found from exc


async def with_platform(info: Info[Context, Any], work: Callable[[Platform, Principal], T]) -> T:
    """`work(team platform, caller)` in a worker thread, the platform closed after it."""
    ctx = info.context
    who = await ctx.who()

    def run() -> T:
        platform = ctx.state.teams.open(who.team)
        try:
            return work(platform, who)
        finally:
            platform.close()

    return await call(run)
