"""The client's side of the wire: every request `RemotePlatform` makes (ROUTES: one table of method and
path, which tests/server/test_api_contract.py checks against the server's OpenAPI document), one httpx
client with the key in a header, errors read back through api/problems.py into the platform's own
exception classes, and the text of streamed logs (lines, server-sent events).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx

from tessera import __version__
from tessera.platform.api.problems import BY_CODE, for_status
from tessera.platform.errors import (
    ClusterError,
    NotAuthorised,
    RemoteError,
    ServerUnreachable,
    SpecError,
)
from tessera.platform.secrets.types import SecretInputError

MiB = 1024 * 1024
MAX_BODY = 64 * MiB          # a JSON answer larger than this is refused rather than held in memory
MAX_ERROR_BODY = 64 * 1024   # an error's detail is read up to this much
MAX_LINE = MiB               # a longer log line is cut (the server streams what the run printed)

# Every request of the client: what it is called -> (HTTP method, path under /api/v1/, {names} filled in
# quoted). The first part of the path names the kind of object, which a bad request's error follows.
ROUTES: dict[str, tuple[str, str]] = {
    "whoami": ("GET", "whoami"),
    "list_clusters": ("GET", "clusters"),
    "add_cluster": ("POST", "clusters"),
    "describe_cluster": ("GET", "clusters/{name}"),
    "remove_cluster": ("DELETE", "clusters/{name}"),
    "clear_node": ("POST", "clusters/{name}/nodes/{node}/clear"),
    "run_page": ("GET", "runs"),
    "create_run": ("POST", "runs"),
    "get_run": ("GET", "runs/{name}"),
    "describe_run": ("GET", "runs/{name}"),
    "update_run": ("PATCH", "runs/{name}"),
    "delete_run": ("DELETE", "runs/{name}"),
    "stop_run": ("POST", "runs/{name}/stop"),
    "restart_run": ("POST", "runs/{name}/restart"),
    "move_run": ("POST", "runs/{name}/move"),
    "clone_run": ("POST", "runs/{name}/clone"),
    "run_metrics": ("GET", "runs/{name}/metrics"),
    "run_events": ("GET", "runs/{name}/events"),
    "follow_logs": ("GET", "runs/{name}/logs"),
    "secrets.list": ("GET", "secrets"),
    "secrets.create": ("POST", "secrets"),
    "secrets.remove": ("DELETE", "secrets/{name}"),
}
# A request the server refused before any platform code ran (`request_invalid`): the class the local
# platform raises for that input, by the kind of object.
_INVALID: dict[str, type[Exception]] = {"runs": SpecError, "secrets": SecretInputError, "clusters": ClusterError}


def error_from(status: int, body: bytes, kind: str, url: str) -> Exception:
    """The exception a refused request raises: the class of the answer's `code` in the problems table
    (by status when the answer has no code, e.g. from a proxy), with the answer's one-line detail."""
    code, detail = _problem(body, status)
    problem = BY_CODE.get(code or "") or for_status(status)
    if problem.code == "request_invalid":
        return _INVALID.get(kind, ValueError)(detail)
    if issubclass(problem.error, NotAuthorised):
        return NotAuthorised(f"not authorised: {detail} (check TESSERA_API_KEY / tessera login)")
    if problem.error is RemoteError:
        if status == 413:
            return RemoteError(f"the server at {url} refused the request as too large: {detail}")
        if status >= 500:
            return RemoteError(f"the server at {url} failed ({status}): {detail}")
        return RemoteError(f"the server at {url} answered {status} ({problem.code}): {detail}")
    return problem.error(detail)


def _problem(body: bytes, status: int) -> tuple[str | None, str]:
    """(code, detail) of an error answer: a problem's, FastAPI's (a string, or a list of validation
    errors), or the start of whatever else came (an HTML page from a proxy)."""
    try:
        answer = json.loads(body)
        detail = answer["detail"]
    except (ValueError, KeyError, TypeError):
        return None, " ".join(body.decode("utf-8", errors="replace").split())[:500] or f"HTTP {status}"
    code = answer.get("code") if isinstance(answer.get("code"), str) else None
    if isinstance(detail, list):
        return code, "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                               if isinstance(e, dict) else str(e) for e in detail)
    return code, str(detail)


class Http:
    """One httpx client with the key in a header; every failure becomes a PlatformError (or the
    ValueError the local platform raises for the same input)."""

    def __init__(self, url: str, api_key: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        headers = {"User-Agent": f"tessera/{__version__}", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.client = httpx.Client(base_url=self.url + "/api/v1/", headers=headers,
                                   timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))

    @contextmanager
    def stream(self, route: str, *, names: dict[str, str] | None = None, body: Any = None,
               params: dict[str, Any] | None = None, endless: bool = False) -> Iterator[httpx.Response]:
        """The answer to ROUTES[route] (its path's {names} filled in), once its status was 2xx; its body
        is not read yet. `endless`: no read timeout."""
        method, template = ROUTES[route]
        path = template.format(**{k: quote(v, safe="") for k, v in (names or {}).items()})
        kind = template.split("/")[0]
        timeout = httpx.Timeout(self.timeout, read=None) if endless else self.client.timeout
        params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            with self.client.stream(method, path, json=body, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    raise error_from(response.status_code, read(response, MAX_ERROR_BODY, truncate=True), kind,
                                     self.url)
                yield response
        except httpx.ConnectError as exc:
            raise ServerUnreachable(f"cannot reach the Tessera server at {self.url}: {exc}") from None
        except httpx.TimeoutException:
            raise ServerUnreachable(f"the Tessera server at {self.url} did not answer within {self.timeout:g} s"
                                    ) from None
        except httpx.HTTPError as exc:
            raise RemoteError(f"talking to the Tessera server at {self.url}: {exc}") from None

    def call(self, route: str, *, names: dict[str, str] | None = None, body: Any = None,
             params: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer (None for an empty one, e.g. 204)."""
        with self.stream(route, names=names, body=body, params=params) as response:
            data = read(response, MAX_BODY)
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise RemoteError(f"the server at {self.url} answered {' '.join(ROUTES[route])} with something other "
                              "than JSON; is TESSERA_API_URL the Tessera server?") from None

    def close(self) -> None:
        self.client.close()


def read(response: httpx.Response, limit: int, *, truncate: bool = False) -> bytes:
    out = bytearray()
    for chunk in response.iter_bytes():
        out += chunk
        if len(out) > limit:
            if truncate:
                return bytes(out[:limit])
            raise RemoteError(f"the server's answer to {response.request.method} {response.request.url.path} "
                              f"is larger than {limit // MiB} MiB; ask for less (limit=...)")
    return bytes(out)


def text_lines(chunks: Iterable[bytes], limit: int = MAX_LINE) -> Iterator[str]:
    """Text lines of a byte stream (split on \\n, as the local log reader does); a line longer than
    `limit` is cut there and the rest of it dropped."""
    buffer, skipping = b"", False
    for chunk in chunks:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            if not skipping:
                yield line[:limit].decode("utf-8", errors="replace")
            skipping = False
        if len(buffer) > limit:
            if not skipping:
                yield buffer[:limit].decode("utf-8", errors="replace")
            buffer, skipping = b"", True
    if buffer and not skipping:
        yield buffer.decode("utf-8", errors="replace")


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The `data` of each server-sent event, until an `end` event (or the stream closes)."""
    data: list[str] = []
    for raw in lines:
        line = raw.removesuffix("\r")
        if not line:
            if data:
                yield "\n".join(data)
            data = []
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event" and value == "end":
            return
        if field == "data":
            data.append(value)
    if data:
        yield "\n".join(data)
