"""Every error the API answers, as application/problem+json (RFC 9457) with a stable `code`:
`{"type", "title", "status", "detail", "code"}`. The status and code of a platform exception come from
the one table in api/problems.py (which the client reads back to the same exception class); `detail` is
one line (a spec's problems, one per line, are joined), never an input's value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tessera.platform.api.models import ProblemDetails
from tessera.platform.api.problems import ERRORS, PROBLEM_JSON, Problem, for_exception, for_status

MAX_DETAIL = 1000

# The error answers the OpenAPI document shows for every operation under /api/v1.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ProblemDetails, "description": "Refused: `code` says why (application/problem+json)."},
    "5XX": {"model": ProblemDetails, "description": "The server failed (application/problem+json)."},
}


def one_line(text: str) -> str:
    """A multi-line message (a spec's problems, one per line) as one line: "a: - b; - c"."""
    out = ""
    for line in (raw.strip() for raw in text.splitlines()):
        if line:
            out += (" " if out.endswith(":") else "; " if out else "") + line
    return out[:MAX_DETAIL]


def problem_response(problem: Problem, detail: str, *, status: int | None = None,
                     headers: dict[str, str] | None = None) -> JSONResponse:
    status = status or problem.status
    body = ProblemDetails(type=problem.type, title=problem.title, status=status,
                          detail=one_line(detail) or problem.title, code=problem.code)
    return JSONResponse(body.model_dump(), status_code=status, headers=headers, media_type=PROBLEM_JSON)


async def _platform_error(_request: Request, exc: Exception) -> JSONResponse:
    problem = for_exception(exc)
    if problem is None:   # registered only for the table's classes; a subclass the table lost is a bug
        return await _internal_error(_request, exc)
    return problem_response(problem, str(exc) or type(exc).__name__)


async def _http_error(_request: Request, exc: HTTPException) -> JSONResponse:
    """Answers of the HTTP layer (a refused key, an unknown path, a body too large), keeping their status."""
    return problem_response(for_status(exc.status_code), str(exc.detail), status=exc.status_code,
                            headers=dict(exc.headers or {}))


async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """One line naming each bad field; never the input (a secret's body holds values)."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        problems.append(f"{where}: {str(error.get('msg', 'invalid')).removeprefix('Value error, ')}")
    return problem_response(for_status(422), "; ".join(problems))


async def _internal_error(_request: Request, exc: Exception) -> JSONResponse:
    """Any other exception: 500 naming its class only (the traceback goes to the server's log)."""
    return problem_response(for_status(500), f"internal error ({type(exc).__name__}); the server's log has "
                                             "the details")


class ProblemApp(FastAPI):
    """FastAPI whose every error answer is a problem: the exception handlers of `install`, and outside
    everything a wrapper that turns a plain-text error of the HTTP layer itself (the body limit's 413,
    sent before any handler runs) into one."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        install(self)

    def build_middleware_stack(self) -> ASGIApp:
        return _PlainErrors(super().build_middleware_stack())


class _PlainErrors:
    """An error answer that is not JSON (Starlette's own "Content Too Large") is sent as a problem."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None
        text = b""

        async def rewrite(message: Message) -> None:
            nonlocal status, text
            if message["type"] == "http.response.start" and message["status"] >= 400 and \
                    "json" not in Headers(raw=message["headers"]).get("content-type", ""):
                status = message["status"]
                return
            if status is None or message["type"] != "http.response.body":
                await send(message)
                return
            text += message.get("body", b"")
            if not message.get("more_body"):
                response = problem_response(for_status(status), text.decode("utf-8", "replace")[:MAX_DETAIL],
                                            status=status)
                await response(scope, receive, send)

        await self.app(scope, receive, rewrite)


def install(app: FastAPI) -> None:
    """Answer every error as a problem: the table's classes, the HTTP layer's, bad requests and the rest;
    and say so in the OpenAPI document."""
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    for error in dict.fromkeys(p.error for p in ERRORS):
        app.add_exception_handler(error, _platform_error)
    app.add_exception_handler(Exception, _internal_error)
    app.openapi = _problem_media_type(app.openapi)  # type: ignore[method-assign]


def _problem_media_type(make: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """FastAPI documents an error model as application/json; the answers are application/problem+json.
    Its 422 (FastAPI's own validation-error shape) is replaced by the problem too."""
    def openapi() -> dict[str, Any]:
        document = make()
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.get("responses", {})
                responses.pop("422", None)
                for status in ERROR_RESPONSES:
                    content = responses.get(str(status), {}).get("content", {})
                    if "application/json" in content:
                        content[PROBLEM_JSON] = content.pop("application/json")
        return document
    return openapi
