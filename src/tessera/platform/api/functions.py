"""The Python SDK as functions, MCLI-style: each opens the `Platform` of a home and calls its method.

    from tessera.platform import create_run, wait_for_run_status, follow_logs
    run = create_run("run.yaml")                       # a path, a YAML string, a dict or a RunSpec
    wait_for_run_status(run.name, "RUNNING")
    for line in follow_logs(run.name):
        print(line)

Every function takes `home=` (default: $TESSERA_HOME or ~/.tessera).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tessera.platform.api.sdk import Platform
from tessera.platform.runs.info import Run
from tessera.platform.spec.run_spec import RunSpec


def _platform(home: str | Path | None) -> Platform:
    return Platform(home)


def create_run(spec: RunSpec | dict[str, Any] | str | Path, *, cluster: str | None = None,
               home: str | Path | None = None, workdir: str | Path | None = None, user: str | None = None) -> Run:
    return _platform(home).create_run(spec, cluster=cluster, workdir=workdir, user=user)


def get_run(name: str, *, home: str | Path | None = None) -> Run:
    return _platform(home).get_run(name)


def list_runs(status: str | Iterable[str] | None = None, *, cluster: str | None = None, limit: int | None = None,
              user: str | None = None, q: str | None = None, home: str | Path | None = None) -> list[Run]:
    return _platform(home).list_runs(status, cluster, limit, user=user, q=q)


def count_runs(status: str | Iterable[str] | None = None, *, cluster: str | None = None, user: str | None = None,
               q: str | None = None, home: str | Path | None = None) -> int:
    return _platform(home).count_runs(status, cluster, user=user, q=q)


def wait_for_run_status(name: str, status: str | Iterable[str], timeout: float | None = None, *,
                        home: str | Path | None = None) -> Run:
    return _platform(home).wait_for_run_status(name, status, timeout)


def follow_logs(name: str, *, rank: int | None = None, resumption: int | None = None, follow: bool = True,
                home: str | Path | None = None) -> Iterator[str]:
    return _platform(home).follow_logs(name, rank, resumption, follow)


def stop_run(name: str, *, home: str | Path | None = None) -> Run:
    return _platform(home).stop_run(name)


def move_run(name: str, cluster: str, *, home: str | Path | None = None) -> Run:
    return _platform(home).move_run(name, cluster)


def restart_run(name: str, *, cluster: str | None = None, home: str | Path | None = None) -> Run:
    return _platform(home).restart_run(name, cluster)


def delete_run(name: str, *, home: str | Path | None = None) -> None:
    _platform(home).delete_run(name)


def update_run(name: str, *, priority: str | None = None, max_duration: float | str | None = None,
               max_retries: int | None = None, preemptible: bool | None = None,
               retry_on_system_failure: bool | None = None, home: str | Path | None = None) -> Run:
    return _platform(home).update_run(name, priority=priority, max_duration=max_duration, max_retries=max_retries,
                                      preemptible=preemptible, retry_on_system_failure=retry_on_system_failure)


def clone_run(name: str, new_name: str, *, cluster: str | None = None, gpus: int | None = None,
              home: str | Path | None = None) -> Run:
    return _platform(home).clone_run(name, new_name, cluster=cluster, gpus=gpus)


def run_metrics(name: str, after: int = 0, *, home: str | Path | None = None) -> tuple[list[dict[str, Any]], int]:
    return _platform(home).run_metrics(name, after)
