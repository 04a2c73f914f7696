"""Errors on the wire: ONE table from the platform's exception classes to an HTTP status and a stable
`code`. The server answers an exception with the first row it is an instance of (application/problem+json:
server/problems.py); the client reads the `code` back to the row and raises that row's class, so a caller
catches the same classes from the in-process Platform and from RemotePlatform.

Rows are ordered most specific first (RunExists before SpecError before ValueError). The last rows are
answers of the HTTP layer itself (a refused key, an unknown path, a body too large), raised client-side
as transport errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

from tessera.platform.errors import (
    AccountError,
    AccountExists,
    AccountNotFound,
    ClusterError,
    ClusterNotFound,
    NotAuthorised,
    PlatformError,
    RemoteError,
    RunExists,
    RunFailed,
    RunNotFound,
    RunStateError,
    SecretError,
    SecretExists,
    SecretNotFound,
    SpecError,
)
from tessera.platform.secrets.types import SecretInputError

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://tessera.dev/problems/"   # + code: names the kind of problem (RFC 9457 `type`)


@dataclass(frozen=True)
class Problem:
    code: str
    status: int
    title: str
    error: type[Exception]

    @property
    def type(self) -> str:
        return TYPE_BASE + self.code


PROBLEMS: tuple[Problem, ...] = (
    Problem("run_exists", 409, "A run of that name exists", RunExists),
    Problem("run_not_found", 404, "No such run", RunNotFound),
    Problem("run_state_conflict", 409, "The run's status does not allow this", RunStateError),
    Problem("run_failed", 409, "The run ended in another status", RunFailed),
    Problem("spec_invalid", 422, "The run spec is invalid", SpecError),
    Problem("secret_exists", 409, "A secret of that name exists", SecretExists),
    Problem("secret_not_found", 404, "No such secret", SecretNotFound),
    Problem("secret_invalid", 422, "A secret's value or option is invalid", SecretInputError),
    Problem("secret_error", 400, "The secret cannot be used or stored", SecretError),
    Problem("cluster_not_found", 404, "No such cluster", ClusterNotFound),
    Problem("cluster_error", 400, "The cluster refused or is misconfigured", ClusterError),
    Problem("account_exists", 409, "The team or user exists", AccountExists),
    Problem("account_not_found", 404, "No such user or key", AccountNotFound),
    Problem("account_error", 400, "The account cannot be changed", AccountError),
    Problem("platform_error", 400, "The platform refused the request", PlatformError),
    Problem("value_invalid", 400, "A value is invalid", ValueError),
    # the HTTP layer's own answers (no platform exception behind them)
    Problem("request_invalid", 422, "The request does not match the API", ValueError),
    Problem("unauthorized", 401, "The API key is missing, unknown or revoked", NotAuthorised),
    Problem("forbidden", 403, "Not allowed for this user", NotAuthorised),
    Problem("bad_request", 400, "The request cannot be read", RemoteError),
    Problem("not_found", 404, "No such path", RemoteError),
    Problem("method_not_allowed", 405, "The path does not take this method", RemoteError),
    Problem("too_large", 413, "The request is too large", RemoteError),
    Problem("internal_error", 500, "The server failed", RemoteError),
)
BY_CODE = {p.code: p for p in PROBLEMS}
_FIRST_HTTP = next(i for i, p in enumerate(PROBLEMS) if p.code == "request_invalid")
ERRORS = PROBLEMS[:_FIRST_HTTP]   # the rows an exception raised by the platform is answered by


def for_exception(exc: BaseException) -> Problem | None:
    """The row of a platform exception (the first it is an instance of); None: not the platform's."""
    return next((p for p in ERRORS if isinstance(exc, p.error)), None)


def for_status(status: int) -> Problem:
    """The HTTP layer's row for a status without a platform exception behind it (401, 404, 413, ...);
    a status without a row of its own is `http_<status>` (a RemoteError)."""
    found = next((p for p in PROBLEMS[_FIRST_HTTP:] if p.status == status), None)
    if found is not None:
        return found
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = f"HTTP {status}"
    return Problem(f"http_{status}", status, title, RemoteError)
