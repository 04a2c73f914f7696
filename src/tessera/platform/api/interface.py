"""The platform's interface, written once: what the CLI, the SDK and the server's routes call, with its
types. Two classes implement it: `Platform` (api/sdk.py: in this process, over the store) and
`RemotePlatform` (api/client.py: over a server's HTTP API). tests/server/test_api_contract.py checks that
both have every method here with the same parameters and types, that the client's requests are routes
of the server's OpenAPI document, and that the console's calls are too.

A default written `...` is the implementation's to choose (a remote client polls less often); every
other default is part of the interface. An implementation may take further keyword-only parameters
with defaults (the server passes the run id it picked to `Platform.create_run`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tessera.platform.api.models import PAGE, EventPage, RunPage
from tessera.platform.runs.info import Run
from tessera.platform.secrets.vault import SecretInfo
from tessera.platform.spec.run_spec import RunSpec


@runtime_checkable
class SecretsAPI(Protocol):
    """A team's secrets: values go in, only names, types and what they expose come out."""

    def create(self, type_: str, name: str, *, overwrite: bool = False, **fields: Any) -> SecretInfo: ...

    def create_s3(self, name: str, access_key_id: str, secret_access_key: str, endpoint: str | None = None,
                  region: str | None = None, overwrite: bool = False) -> SecretInfo: ...

    def create_env(self, name: str, values: dict[str, str], overwrite: bool = False) -> SecretInfo: ...

    def create_file(self, name: str, source: str | Path, env_var: str | None = None,
                    mount_path: str | None = None, overwrite: bool = False) -> SecretInfo: ...

    def list(self) -> list[SecretInfo]: ...

    def remove(self, name: str) -> None: ...


@runtime_checkable
class PlatformAPI(Protocol):
    """One team's platform. Errors are the classes of tessera.platform.errors in both implementations
    (api/problems.py carries them over HTTP)."""

    @property
    def secrets(self) -> SecretsAPI: ...

    def close(self) -> None: ...

    # --- clusters ---------------------------------------------------------------------------------

    def add_cluster(self, name: str, type_: str, *, replace: bool = False, **config: Any) -> dict[str, Any]: ...

    def list_clusters(self) -> list[dict[str, Any]]: ...

    def describe_cluster(self, name: str) -> dict[str, Any]: ...

    def remove_cluster(self, name: str) -> None: ...

    def clear_node(self, cluster: str, node: str) -> bool: ...

    # --- runs -------------------------------------------------------------------------------------

    def create_run(self, spec: RunSpec | dict[str, Any] | str | Path, *, cluster: str | None = None,
                   workdir: str | Path | None = None, supervise: bool = True, user: str | None = None) -> Run: ...

    def get_run(self, name: str) -> Run: ...

    def describe_run(self, name: str) -> dict[str, Any]: ...

    def run_page(self, status: str | Iterable[str] | None = None, cluster: str | None = None, *,
                 user: str | None = None, q: str | None = None, cursor: str | None = None,
                 limit: int = PAGE) -> RunPage:
        """A page of run summaries, newest first; pass its next_cursor for the next page."""
        ...

    def list_runs(self, status: str | Iterable[str] | None = None, cluster: str | None = None,
                  limit: int | None = None, *, user: str | None = None, q: str | None = None) -> list[Run]: ...

    def count_runs(self, status: str | Iterable[str] | None = None, cluster: str | None = None, *,
                   user: str | None = None, q: str | None = None) -> int: ...

    def run_summaries(self, status: str | Iterable[str] | None = None, cluster: str | None = None,
                      limit: int | None = None, *, user: str | None = None, q: str | None = None
                      ) -> tuple[list[dict[str, Any]], int]: ...

    def wait_for_run_status(self, name: str, status: str | Iterable[str], timeout: float | None = None,
                            poll: float = ...) -> Run: ...

    def stop_run(self, name: str) -> Run: ...

    def move_run(self, name: str, cluster: str) -> Run: ...

    def restart_run(self, name: str, cluster: str | None = None) -> Run: ...

    def delete_run(self, name: str) -> None: ...

    def update_run(self, name: str, *, priority: str | None = None, max_duration: float | str | None = None,
                   max_retries: int | None = None, preemptible: bool | None = None,
                   retry_on_system_failure: bool | None = None) -> Run: ...

    def clone_run(self, name: str, new_name: str, *, cluster: str | None = None, gpus: int | None = None) -> Run: ...

    def run_metrics(self, name: str, after: int = 0) -> tuple[list[dict[str, Any]], int]: ...

    def run_events(self, name: str, cursor: str | None = None, limit: int = PAGE) -> EventPage:
        """The run's events after `cursor`, oldest first, with its resumptions as they are now."""
        ...

    def follow_logs(self, name: str, rank: int | None = None, resumption: int | None = None,
                    follow: bool = True, poll: float = 0.25) -> Iterator[str]: ...
