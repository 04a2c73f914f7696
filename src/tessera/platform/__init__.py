"""Runs anywhere: run specs, clusters (local, Slurm, experimental Kubernetes), secrets, and a supervisor
that detects failures, resumes and moves runs. The platform launches commands and reads what runs
report (heartbeats, events, exit status, logs); it never imports training code. See docs/platform.md.

`connect()` returns the local `Platform`, or a `RemotePlatform` (the team server's API, same methods) when
TESSERA_API_URL or `tessera login` names a server; the client loads on first use (it needs httpx).
"""

from typing import TYPE_CHECKING

from tessera.lazy_exports import lazy_exports
from tessera.platform.api.connection import connect
from tessera.platform.api.functions import (
    clone_run,
    count_runs,
    create_run,
    delete_run,
    follow_logs,
    get_run,
    list_runs,
    move_run,
    restart_run,
    run_metrics,
    stop_run,
    update_run,
    wait_for_run_status,
)
from tessera.platform.api.sdk import Platform
from tessera.platform.errors import (
    ClusterError,
    PlatformError,
    RunExists,
    RunFailed,
    RunNotFound,
    RunStateError,
    SecretError,
    SpecError,
)
from tessera.platform.runs.info import Run
from tessera.platform.spec.run_spec import RunSpec, load_spec, parse_spec

if TYPE_CHECKING:
    from tessera.platform.api.client import RemotePlatform

__getattr__ = lazy_exports(__name__, {"api.client": ["RemotePlatform"]})

__all__ = [
    "ClusterError", "Platform", "PlatformError", "RemotePlatform", "Run", "RunExists", "RunFailed", "RunNotFound", "RunSpec",
    "RunStateError",
    "SecretError", "SpecError", "clone_run", "connect", "count_runs", "create_run", "delete_run", "follow_logs", "get_run",
    "list_runs", "load_spec", "move_run", "parse_spec", "restart_run", "run_metrics", "stop_run", "update_run",
    "wait_for_run_status",
]
