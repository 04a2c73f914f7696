"""`RemotePlatform`: the SDK's `Platform` methods, spoken over the control-plane server's HTTP API (v1).

One behaviour, two transports: the CLI and scripts call the same methods with the same arguments and get
the same `Run` objects and dicts back, whether `connect()` gave them the local store or a server. Errors
come back as the platform's own exception classes (RunNotFound, SpecError, ClusterError, ...), so a caller
catches the same things in both modes; transport failures are `RemoteError`s with one line naming the URL.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tessera import __version__
from tessera.platform.api.inputs import as_spec, run_statuses
from tessera.platform.api.sdk import Platform
from tessera.platform.errors import (
    ClusterError,
    PlatformError,
    RunNotFound,
    RunStateError,
    SecretError,
    SpecError,
)
from tessera.platform.runs.info import Run
from tessera.platform.secrets.input import content_from_file
from tessera.platform.secrets.vault import SecretInfo, SecretInputError, SecretStore, default_env_var
from tessera.platform.spec.run_spec import RunSpec, validate_name

MiB = 1024 * 1024
MAX_BODY = 64 * MiB          # a JSON answer larger than this is refused rather than held in memory
MAX_ERROR_BODY = 64 * 1024   # an error's detail is read up to this much
MAX_LINE = MiB               # a longer log line is cut (the server streams what the run printed)
PAGE = 1000                  # runs per list request: the server's largest page


class RemoteError(PlatformError):
    """The server could not be reached, or answered something other than what the API promises."""


class NotAuthorised(RemoteError):
    """The server refused the API key (401) or the action for this user (403)."""


class ServerUnreachable(RemoteError):
    """No answer from the server's URL (refused, unresolvable, timed out)."""


class RunConflict(RunStateError, SpecError):
    """409 on a run: its name is taken (a SpecError locally) or its status does not allow the action (a
    RunStateError locally); the answer does not say which, so either `except` catches it."""


# Which error class a refused request on each kind of object raises: the class the local Platform raises.
_KIND_ERRORS: dict[str, type[PlatformError]] = {"cluster": ClusterError, "secret": SecretError}


def _error(status: int, detail: str, kind: str, url: str) -> PlatformError:
    if status in (401, 403):
        return NotAuthorised(f"not authorised: {detail} (check TESSERA_API_KEY / tessera login)")
    if status == 413:
        return RemoteError(f"the server at {url} refused the request as too large: {detail}")
    if status >= 500:
        return RemoteError(f"the server at {url} failed ({status}): {detail}")
    if kind == "run":
        if status == 404:
            return RunNotFound(detail)
        if status == 409:
            return RunConflict(detail)
        return SpecError(detail) if status == 422 else PlatformError(detail)
    if kind == "secret" and status == 422:
        return SecretInputError(detail)   # a bad value: a usage error, as it is locally
    return _KIND_ERRORS.get(kind, RemoteError)(detail)


def _detail(body: bytes, status: int) -> str:
    """The server's `detail` (FastAPI: a string, or a list of validation errors) as one message."""
    try:
        detail = json.loads(body)["detail"]
    except (ValueError, KeyError, TypeError):
        return " ".join(body.decode("utf-8", errors="replace").split())[:500] or f"HTTP {status}"
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                         if isinstance(e, dict) else str(e) for e in detail)
    return str(detail)


def _checked_name(name: str, kind: str) -> str:
    """A name quoted for a URL path; a malformed one is refused here, so it never becomes another path."""
    try:
        return quote(validate_name(name, f"{kind} name"), safe="")
    except ValueError as exc:
        if kind == "run":
            raise RunNotFound(f"no run named {name!r}: {exc}") from None
        raise _KIND_ERRORS.get(kind, RemoteError)(str(exc)) from None


def _lines(chunks: Iterable[bytes], limit: int = MAX_LINE) -> Iterator[str]:
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


class _Http:
    """One httpx client with the key in a header; every failure becomes a PlatformError."""

    def __init__(self, url: str, api_key: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        headers = {"User-Agent": f"tessera/{__version__}", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.client = httpx.Client(base_url=self.url + "/api/v1/", headers=headers,
                                   timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))

    @contextmanager
    def stream(self, method: str, path: str, kind: str, *, body: Any = None, params: dict[str, Any] | None = None,
               endless: bool = False) -> Iterator[httpx.Response]:
        """A response whose status was 2xx; its body is not read yet. `endless`: no read timeout."""
        timeout = httpx.Timeout(self.timeout, read=None) if endless else self.client.timeout
        params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            with self.client.stream(method, path, json=body, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    detail = _detail(_read(response, MAX_ERROR_BODY, truncate=True), response.status_code)
                    raise _error(response.status_code, detail, kind, self.url)
                yield response
        except httpx.ConnectError as exc:
            raise ServerUnreachable(f"cannot reach the Tessera server at {self.url}: {exc}") from None
        except httpx.TimeoutException:
            raise ServerUnreachable(f"the Tessera server at {self.url} did not answer within {self.timeout:g} s"
                                    ) from None
        except httpx.HTTPError as exc:
            raise RemoteError(f"talking to the Tessera server at {self.url}: {exc}") from None

    def call(self, method: str, path: str, kind: str, *, body: Any = None,
             params: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer (None for an empty one, e.g. 204)."""
        with self.stream(method, path, kind, body=body, params=params) as response:
            data = _read(response, MAX_BODY)
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise RemoteError(f"the server at {self.url} answered {method} {path} with something other than "
                              "JSON; is TESSERA_API_URL the Tessera server?") from None

    def close(self) -> None:
        self.client.close()


def _read(response: httpx.Response, limit: int, *, truncate: bool = False) -> bytes:
    out = bytearray()
    for chunk in response.iter_bytes():
        out += chunk
        if len(out) > limit:
            if truncate:
                return bytes(out[:limit])
            raise RemoteError(f"the server's answer to {response.request.method} {response.request.url.path} "
                              f"is larger than {limit // MiB} MiB; ask for less (limit=...)")
    return bytes(out)


class RemoteSecrets:
    """`SecretStore`'s create/list/remove, on the server (values go up, never come back)."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    def create(self, type_: str, name: str, *, overwrite: bool = False, **fields: Any) -> SecretInfo:
        """A secret of any type the server knows; `fields` are that type's (as in `SecretStore.create`),
        bytes (a file's content) sent as base64."""
        sent = {k: base64.b64encode(v).decode("ascii") if isinstance(v, bytes | bytearray) else v
                for k, v in fields.items() if v is not None}
        body = {"type": type_, "name": name, "overwrite": overwrite, **sent}
        return _secret_info(self._http.call("POST", "secrets", "secret", body=body))

    # The store's typed shortcuts only call `self.create`: the same functions serve both.
    create_s3 = SecretStore.create_s3
    create_env = SecretStore.create_env

    def create_file(self, name: str, source: str | Path, env_var: str | None = None,
                    mount_path: str | None = None, overwrite: bool = False) -> SecretInfo:
        """The file is read here (at most 64 KiB, the limit of the local store) and sent up."""
        content = content_from_file(str(source), f"file secret {name!r}")
        return self.create("file", name, filename=Path(source).name, env_var=env_var or default_env_var(name),
                           mount_path=mount_path, content=content, overwrite=overwrite)

    def list(self) -> list[SecretInfo]:
        answer = self._http.call("GET", "secrets", "secret")
        items = answer["secrets"] if isinstance(answer, dict) else answer
        return [_secret_info(item) for item in items]

    def remove(self, name: str) -> None:
        self._http.call("DELETE", f"secrets/{_checked_name(name, 'secret')}", "secret")


def _secret_info(d: dict[str, Any]) -> SecretInfo:
    return SecretInfo(d["name"], d["type"], d.get("created") or 0.0, list(d.get("exposes") or []))


class RemotePlatform:
    """The platform of one team on a Tessera server: `Platform`'s methods over HTTP."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 30.0) -> None:
        self._http = _Http(url, api_key, timeout)
        self.url = self._http.url
        self.secrets = RemoteSecrets(self._http)

    def close(self) -> None:
        self._http.close()

    def whoami(self) -> dict[str, Any]:
        """{"user", "team", "admin"} of the API key (checks the key)."""
        answer: dict[str, Any] = self._http.call("GET", "whoami", "user")
        return answer

    # --- clusters ---------------------------------------------------------------------------------

    def add_cluster(self, name: str, type_: str, *, replace: bool = False, **config: Any) -> dict[str, Any]:
        config = {k: v for k, v in config.items() if v not in (None, "", [], {})}
        body = {"name": name, "type": type_, "replace": replace, "config": config}
        answer: dict[str, Any] = self._http.call("POST", "clusters", "cluster", body=body)
        return answer

    def list_clusters(self) -> list[dict[str, Any]]:
        answer = self._http.call("GET", "clusters", "cluster")
        return list(answer["clusters"] if isinstance(answer, dict) else answer)

    def describe_cluster(self, name: str) -> dict[str, Any]:
        answer: dict[str, Any] = self._http.call("GET", f"clusters/{_checked_name(name, 'cluster')}", "cluster")
        return answer

    def remove_cluster(self, name: str) -> None:
        self._http.call("DELETE", f"clusters/{_checked_name(name, 'cluster')}", "cluster")

    def clear_node(self, cluster: str, node: str) -> bool:
        """Forget a node's faults, so it is used again."""
        path = f"clusters/{_checked_name(cluster, 'cluster')}/nodes/{quote(node, safe='')}/clear"
        answer = self._http.call("POST", path, "cluster")
        return bool(answer.get("cleared", True)) if isinstance(answer, dict) else bool(answer)

    # --- runs -------------------------------------------------------------------------------------

    def _run_call(self, method: str, name: str, action: str = "", body: Any = None) -> Any:
        path = f"runs/{_checked_name(name, 'run')}" + (f"/{action}" if action else "")
        return self._http.call(method, path, "run", body=body)

    def create_run(self, spec: RunSpec | dict[str, Any] | str | Path, *, cluster: str | None = None,
                   workdir: str | Path | None = None, supervise: bool = True, user: str | None = None) -> Run:
        """Submit a run: the spec (Tessera's or MCLI's) is read and checked here as the local platform
        does, so a mistake gets the same message; the server checks it again and its team's supervisor
        starts it. `workdir`, `supervise` and `user` are the server's to decide (its folders, its supervisor,
        the key's user) and are not sent."""
        body = {"spec": as_spec(spec).model_dump(mode="json"), "cluster": cluster}
        answer = self._http.call("POST", "runs", "run", body=body)
        return Run.from_dict(answer)

    def get_run(self, name: str) -> Run:
        return Run.from_dict(self._run_call("GET", name))

    def run_summaries(self, status: str | Iterable[str] | None = None, cluster: str | None = None,
                      limit: int | None = None, *, user: str | None = None, offset: int = 0,
                      q: str | None = None) -> tuple[list[dict[str, Any]], int]:
        """(one summary dict per run, newest first; how many runs match): what `run list` shows. Without
        a limit every run comes, a page of the server's largest size at a time."""
        params: dict[str, Any] = {"status": ",".join(run_statuses(status) or ()) or None, "cluster": cluster,
                                  "user": user, "q": q}
        rows: list[dict[str, Any]] = []
        total = 0
        while limit is None or len(rows) < limit:
            want = PAGE if limit is None else min(PAGE, limit - len(rows))
            answer = self._http.call("GET", "runs", "run", params={**params, "limit": want,
                                                                   "offset": offset + len(rows)})
            page, total = list(answer["runs"]), int(answer["total"])
            rows += page
            if len(page) < want:
                break
        return rows, total

    def list_runs(self, status: str | Iterable[str] | None = None, cluster: str | None = None,
                  limit: int | None = None, *, user: str | None = None, offset: int = 0,
                  q: str | None = None) -> list[Run]:
        """Full runs (spec, resumptions, events): one request per run on top of the list, so give a `limit`
        for a long history, or use `run_summaries`."""
        summaries, _ = self.run_summaries(status, cluster, limit, user=user, offset=offset, q=q)
        return [self.get_run(s["name"]) for s in summaries]

    def count_runs(self, status: str | Iterable[str] | None = None, cluster: str | None = None, *,
                   user: str | None = None, q: str | None = None) -> int:
        return self.run_summaries(status, cluster, 1, user=user, q=q)[1]

    def wait_for_run_status(self, name: str, status: str | Iterable[str], timeout: float | None = None,
                            poll: float = 0.5) -> Run:
        """The same rules as `Platform.wait_for_run_status`, which only reads the run through `get_run`:
        it is called with this object, so both modes wait for exactly the same thing."""
        return Platform.wait_for_run_status(self, name, status, timeout, poll)  # type: ignore[arg-type]

    def stop_run(self, name: str) -> Run:
        return Run.from_dict(self._run_call("POST", name, "stop"))

    def move_run(self, name: str, cluster: str) -> Run:
        return Run.from_dict(self._run_call("POST", name, "move", {"cluster": cluster}))

    def restart_run(self, name: str, cluster: str | None = None) -> Run:
        return Run.from_dict(self._run_call("POST", name, "restart", {"cluster": cluster}))

    def delete_run(self, name: str) -> None:
        self._run_call("DELETE", name)

    def update_run(self, name: str, *, priority: str | None = None, max_duration: Any = None,
                   max_retries: int | None = None) -> Run:
        body = {k: v for k, v in (("priority", priority), ("max_duration", max_duration),
                                  ("max_retries", max_retries)) if v is not None}
        return Run.from_dict(self._run_call("PATCH", name, body=body))

    def clone_run(self, name: str, new_name: str, *, cluster: str | None = None, gpus: int | None = None) -> Run:
        return Run.from_dict(self._run_call("POST", name, "clone", {"name": new_name, "cluster": cluster,
                                                                   "gpus": gpus}))

    def describe_run(self, name: str) -> dict[str, Any]:
        """What `run describe` shows (the server redacted it, as the local platform does)."""
        answer: dict[str, Any] = self._run_call("GET", name)
        return answer

    def run_metrics(self, name: str, after: int = 0) -> tuple[list[dict[str, Any]], int]:
        answer = self._http.call("GET", f"runs/{_checked_name(name, 'run')}/metrics", "run",
                                 params={"after": after})
        return list(answer["rows"]), int(answer["next"])

    def follow_logs(self, name: str, rank: int | None = None, resumption: int | None = None,
                    follow: bool = True, poll: float = 0.25) -> Iterator[str]:
        """The run's log lines as the server's platform reads them (redacted there). Following streams
        server-sent events until the server's `end` event: no read timeout, a quiet run may print nothing
        for hours."""
        params = {"rank": rank, "resumption": resumption, "follow": int(follow)}
        path = f"runs/{_checked_name(name, 'run')}/logs"
        with self._http.stream("GET", path, "run", params=params, endless=follow) as response:
            lines = _lines(response.iter_bytes())
            yield from sse_data(lines) if follow else lines
