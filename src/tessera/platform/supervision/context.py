"""What every part of a supervisor pass shares: its settings, the database, the secrets, the cluster
backends it has opened, the nodes it has seen unhealthy, and the one way a run ends (`finish`).

The truth is in the store; what lives here is either configuration or a cache that a restarted supervisor
rebuilds, which is why a supervisor killed at any point loses nothing. The parts of a pass
(`run_pass`, `submission`, `retries`) are functions of this context, so their state is this dataclass
and nothing else.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from tessera.platform.clusters import LOCAL, ClusterBackend, make_backend
from tessera.platform.errors import ClusterError
from tessera.platform.runs.artifacts import ENV_ARTIFACTS_URL, ArtifactStore, artifacts_url
from tessera.platform.runs.shipping import Shipper
from tessera.platform.secrets.vault import SecretStore
from tessera.platform.store.leases import DEFAULT_LEASE_SECONDS, Fence
from tessera.platform.store.state import FAILED, RunRecord, StateDB


@dataclass
class SupervisorSettings:
    """Tunables, from the environment of whoever starts the supervisor (tests shorten them)."""
    poll: float = 1.0            # seconds between passes
    idle_exit: float = 300.0     # exit after this long with no active run
    retry_backoff: float = 2.0   # first retry delay in seconds; doubles per retry, capped at 300 s
    early_window: float = 300.0  # a run without heartbeats "made progress" once it ran this long
    lease_seconds: float = DEFAULT_LEASE_SECONDS   # a run's lease lasts this long unless renewed (leases.py)
    artifacts_url: str | None = None   # where run files, logs and metrics go (None: a folder in the home)

    @classmethod
    def from_env(cls) -> SupervisorSettings:
        def get(name: str, default: float) -> float:
            return float(os.environ.get(name, default))
        return cls(poll=get("TESSERA_SUPERVISOR_POLL", 1.0), idle_exit=get("TESSERA_SUPERVISOR_IDLE", 300.0),
                   retry_backoff=get("TESSERA_RETRY_BACKOFF", 2.0),
                   early_window=get("TESSERA_EARLY_WINDOW", 300.0),
                   lease_seconds=get("TESSERA_LEASE_SECONDS", DEFAULT_LEASE_SECONDS),
                   artifacts_url=os.environ.get(ENV_ARTIFACTS_URL))


def cluster_backend(db: StateDB, name: str) -> ClusterBackend:
    """The backend of cluster `name`; `local` exists even when it was never added."""
    record = db.get_cluster(name)
    if record is None:
        if name == LOCAL:
            return make_backend(LOCAL, "local", {})
        known = ", ".join([LOCAL, *(c.name for c in db.list_clusters() if c.name != LOCAL)])
        raise ClusterError(f"cluster {name!r} is not known (known: {known}); add it with "
                           f"`tessera cluster add {name} --type slurm ...`")
    return make_backend(record.name, record.type, record.config)


@dataclass
class SupervisorContext:
    """One team's part of a supervisor: `home` is where this replica keeps the team's run folders, `db`
    the team's view of the store, fenced by the supervisor's leases."""
    home: Path
    settings: SupervisorSettings
    db: StateDB
    secrets: SecretStore
    artifacts: ArtifactStore                 # where the runs' files are shipped, and read from
    replica: str = ""
    shipper: Shipper = field(default_factory=Shipper)                   # what it has shipped: a cache
    backends: dict[str, ClusterBackend] = field(default_factory=dict)   # opened once per cluster
    # cluster -> node -> last time seen unhealthy: names the culprit when a job ends in NODE_FAIL
    unhealthy: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def for_team(cls, engine: Engine, team: str, home: Path, settings: SupervisorSettings, fence: Fence
                 ) -> SupervisorContext:
        return cls(home, settings, StateDB(engine, team, fence=fence), SecretStore(home, engine=engine, team=team),
                   ArtifactStore.open(artifacts_url(home, settings.artifacts_url), team), fence.owner)

    def log(self, message: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}", file=sys.stderr, flush=True)

    def backend(self, name: str) -> ClusterBackend:
        if name not in self.backends:
            self.backends[name] = cluster_backend(self.db, name)
        return self.backends[name]

    def run_time(self, run: RunRecord, now: float) -> float:
        """Running time over all resumptions so far: what max_duration limits."""
        total = 0.0
        for r in self.db.resumptions(run.id):
            if r.start is not None:
                total += (r.end or now) - r.start
        return total

    def finish(self, run: RunRecord, status: str, message: str | None, kind: str | None = None,
               first_error: str | None = None) -> None:
        """End the run in a terminal status, dropping any request and retry delay."""
        fields: dict[str, Any] = {"status": status, "ended": time.time(), "request": None, "request_arg": None,
                                  "not_before": None}
        if status == FAILED:
            fields.update(failure_kind=kind, first_error=first_error or message)
        self.db.update_run(run.id, **fields)
        self.db.add_event(run.id, status.lower(), message or status.lower())
        self.log(f"run {run.name}: {status}" + (f" ({message})" if message else ""))
