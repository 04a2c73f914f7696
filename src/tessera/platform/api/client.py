"""`RemotePlatform`: the platform's interface (api/interface.py), spoken over the control-plane server's
HTTP API (v1).

One behaviour, two transports: the CLI and scripts call the same methods with the same arguments and get
the same `Run` objects and dicts back, whether `connect()` gave them the local store or a server. Errors
come back as the platform's own exception classes (RunNotFound, RunExists, SecretNotFound, ...: the
answer's `code`, api/problems.py), so a caller catches the same things in both modes; transport failures
are `RemoteError`s with one line naming the URL. Answers are read through api/models.py, the models the
server's routes declare.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tessera.platform.api.inputs import as_spec, run_statuses
from tessera.platform.api.models import MAX_PAGE, PAGE, EventPage, Metrics, RunPage, SecretList, SecretSummary
from tessera.platform.api.sdk import Platform
from tessera.platform.api.transport import Http, sse_data, text_lines
from tessera.platform.errors import (
    ClusterError,
    NotAuthorised,
    RemoteError,
    RunNotFound,
    ServerUnreachable,
)
from tessera.platform.runs.info import Run
from tessera.platform.secrets.input import content_from_file
from tessera.platform.secrets.vault import SecretInfo, SecretInputError, SecretStore, default_env_var
from tessera.platform.spec.run_spec import RunSpec, validate_name

__all__ = ["NotAuthorised", "RemotePlatform", "RemoteError", "RemoteSecrets", "ServerUnreachable"]

# The class a malformed name raises, by kind (the local platform's): a run's is not found.
_NAME_ERRORS: dict[str, type[Exception]] = {"run": RunNotFound, "cluster": ClusterError, "secret": SecretInputError}


def _checked_name(name: str, kind: str) -> dict[str, str]:
    """{"name": name} for a path, once the name is one the server could have: a malformed one is refused
    here, so it never becomes another path."""
    try:
        return {"name": validate_name(name, f"{kind} name")}
    except ValueError as exc:
        message = f"no run named {name!r}: {exc}" if kind == "run" else str(exc)
        raise _NAME_ERRORS[kind](message) from None


class RemoteSecrets:
    """`SecretStore`'s create/list/remove, on the server (values go up, never come back)."""

    def __init__(self, http: Http) -> None:
        self._http = http

    def create(self, type_: str, name: str, *, overwrite: bool = False, **fields: Any) -> SecretInfo:
        """A secret of any type the server knows; `fields` are that type's (as in `SecretStore.create`),
        bytes (a file's content) sent as base64."""
        sent = {k: base64.b64encode(v).decode("ascii") if isinstance(v, bytes | bytearray) else v
                for k, v in fields.items() if v is not None}
        body = {"type": type_, "name": name, "overwrite": overwrite, **sent}
        return _secret_info(SecretSummary.model_validate(self._http.call("secrets.create", body=body)))

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
        return [_secret_info(s) for s in SecretList.model_validate(self._http.call("secrets.list")).secrets]

    def remove(self, name: str) -> None:
        self._http.call("secrets.remove", names=_checked_name(name, "secret"))


def _secret_info(s: SecretSummary) -> SecretInfo:
    return SecretInfo(s.name, s.type, s.created, list(s.exposes))


def _statuses(status: str | Iterable[str] | None) -> str | None:
    return ",".join(run_statuses(status) or ()) or None


class RemotePlatform:
    """The platform of one team on a Tessera server: `Platform`'s methods over HTTP."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 30.0) -> None:
        self._http = Http(url, api_key, timeout)
        self.url = self._http.url
        self.secrets = RemoteSecrets(self._http)

    def close(self) -> None:
        self._http.close()

    def whoami(self) -> dict[str, Any]:
        """{"user", "team", "admin"} of the API key (checks the key)."""
        answer: dict[str, Any] = self._http.call("whoami")
        return answer

    # --- clusters ---------------------------------------------------------------------------------

    def add_cluster(self, name: str, type_: str, *, replace: bool = False, **config: Any) -> dict[str, Any]:
        config = {k: v for k, v in config.items() if v not in (None, "", [], {})}
        body = {"name": name, "type": type_, "replace": replace, "config": config}
        answer: dict[str, Any] = self._http.call("add_cluster", body=body)
        return answer

    def list_clusters(self) -> list[dict[str, Any]]:
        return list(self._http.call("list_clusters")["clusters"])

    def describe_cluster(self, name: str) -> dict[str, Any]:
        answer: dict[str, Any] = self._http.call("describe_cluster", names=_checked_name(name, "cluster"))
        return answer

    def remove_cluster(self, name: str) -> None:
        self._http.call("remove_cluster", names=_checked_name(name, "cluster"))

    def clear_node(self, cluster: str, node: str) -> bool:
        """Forget a node's faults, so it is used again."""
        names = {**_checked_name(cluster, "cluster"), "node": node}
        return bool(self._http.call("clear_node", names=names)["cleared"])

    # --- runs -------------------------------------------------------------------------------------

    def _run(self, route: str, name: str, body: Any = None) -> Run:
        return Run.from_dict(self._http.call(route, names=_checked_name(name, "run"), body=body))

    def create_run(self, spec: RunSpec | dict[str, Any] | str | Path, *, cluster: str | None = None,
                   workdir: str | Path | None = None, supervise: bool = True, user: str | None = None) -> Run:
        """Submit a run: the spec (Tessera's or MCLI's) is read and checked here as the local platform
        does, so a mistake gets the same message; the server checks it again and its team's supervisor
        starts it. `workdir`, `supervise` and `user` are the server's to decide (its folders, its supervisor,
        the key's user) and are not sent."""
        body = {"spec": as_spec(spec).model_dump(mode="json"), "cluster": cluster}
        return Run.from_dict(self._http.call("create_run", body=body))

    def get_run(self, name: str) -> Run:
        return self._run("get_run", name)

    def describe_run(self, name: str) -> dict[str, Any]:
        """What `run describe` shows (the server redacted it, as the local platform does)."""
        answer: dict[str, Any] = self._http.call("describe_run", names=_checked_name(name, "run"))
        return answer

    def run_page(self, status: str | Iterable[str] | None = None, cluster: str | None = None, *,
                 user: str | None = None, q: str | None = None, cursor: str | None = None,
                 limit: int = PAGE) -> RunPage:
        params = {"status": _statuses(status), "cluster": cluster, "user": user, "q": q, "cursor": cursor,
                  "limit": limit}
        return RunPage.model_validate(self._http.call("run_page", params=params))

    def run_summaries(self, status: str | Iterable[str] | None = None, cluster: str | None = None,
                      limit: int | None = None, *, user: str | None = None, q: str | None = None
                      ) -> tuple[list[dict[str, Any]], int]:
        """(one summary dict per run, newest first; how many runs match): what `run list` shows. Without
        a limit every run comes, a page of the server's largest size at a time."""
        rows: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            want = MAX_PAGE if limit is None else min(MAX_PAGE, limit - len(rows))
            page = self.run_page(status, cluster, user=user, q=q, cursor=cursor, limit=want)
            rows += [item.model_dump() for item in page.items]
            cursor = page.next_cursor
            if cursor is None or (limit is not None and len(rows) >= limit):
                return rows, page.total

    def list_runs(self, status: str | Iterable[str] | None = None, cluster: str | None = None,
                  limit: int | None = None, *, user: str | None = None, q: str | None = None) -> list[Run]:
        """Full runs (spec, resumptions, events): one request per run on top of the list, so give a `limit`
        for a long history, or use `run_page`."""
        summaries, _ = self.run_summaries(status, cluster, limit, user=user, q=q)
        return [self.get_run(s["name"]) for s in summaries]

    def count_runs(self, status: str | Iterable[str] | None = None, cluster: str | None = None, *,
                   user: str | None = None, q: str | None = None) -> int:
        return self.run_page(status, cluster, user=user, q=q, limit=1).total

    def wait_for_run_status(self, name: str, status: str | Iterable[str], timeout: float | None = None,
                            poll: float = 0.5) -> Run:
        """The same rules as `Platform.wait_for_run_status`, which only reads the run through `get_run`:
        it is called with this object, so both modes wait for exactly the same thing."""
        return Platform.wait_for_run_status(self, name, status, timeout, poll)  # type: ignore[arg-type]

    def stop_run(self, name: str) -> Run:
        return self._run("stop_run", name)

    def move_run(self, name: str, cluster: str) -> Run:
        return self._run("move_run", name, {"cluster": cluster})

    def restart_run(self, name: str, cluster: str | None = None) -> Run:
        return self._run("restart_run", name, {"cluster": cluster})

    def delete_run(self, name: str) -> None:
        self._http.call("delete_run", names=_checked_name(name, "run"))

    def update_run(self, name: str, *, priority: str | None = None, max_duration: float | str | None = None,
                   max_retries: int | None = None, preemptible: bool | None = None,
                   retry_on_system_failure: bool | None = None) -> Run:
        body = {k: v for k, v in (("priority", priority), ("max_duration", max_duration),
                                  ("max_retries", max_retries), ("preemptible", preemptible),
                                  ("retry_on_system_failure", retry_on_system_failure)) if v is not None}
        return self._run("update_run", name, body)

    def clone_run(self, name: str, new_name: str, *, cluster: str | None = None, gpus: int | None = None) -> Run:
        return self._run("clone_run", name, {"name": new_name, "cluster": cluster, "gpus": gpus})

    def run_metrics(self, name: str, after: int = 0) -> tuple[list[dict[str, Any]], int]:
        answer = self._http.call("run_metrics", names=_checked_name(name, "run"), params={"after": after})
        metrics = Metrics.model_validate(answer)
        return metrics.rows, metrics.next

    def run_events(self, name: str, cursor: str | None = None, limit: int = PAGE) -> EventPage:
        answer = self._http.call("run_events", names=_checked_name(name, "run"),
                                 params={"cursor": cursor, "limit": limit})
        return EventPage.model_validate(answer)

    def follow_logs(self, name: str, rank: int | None = None, resumption: int | None = None,
                    follow: bool = True, poll: float = 0.25) -> Iterator[str]:
        """The run's log lines as the server's platform reads them (redacted there). Following streams
        server-sent events until the server's `end` event: no read timeout, a quiet run may print nothing
        for hours."""
        params = {"rank": rank, "resumption": resumption, "follow": int(follow)}
        with self._http.stream("follow_logs", names=_checked_name(name, "run"), params=params,
                               endless=follow) as response:
            lines = text_lines(response.iter_bytes())
            yield from sse_data(lines) if follow else lines
