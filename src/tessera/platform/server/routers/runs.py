"""Runs: list, submit, describe, and the lifecycle verbs (stop, restart, move, clone, update, delete).
Each handler is one call of the team's Platform; every change is written to the audit log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from tessera.platform.server.auth import CurrentUser, State, TeamPlatform
from tessera.platform.server.params import Limit, Offset, RunName
from tessera.platform.server.schemas import (
    NAME_MAX,
    CloneRun,
    ClusterChoice,
    MoveRun,
    SubmitRun,
    UpdateRun,
)
from tessera.platform.spec import validate_name

router = APIRouter(prefix="/runs", tags=["runs"])


@router.get("")
def list_runs(platform: TeamPlatform,
              status: Annotated[str | None, Query(max_length=200, description="Comma-separated statuses.")] = None,
              cluster: Annotated[str | None, Query(max_length=NAME_MAX)] = None,
              user: Annotated[str | None, Query(max_length=NAME_MAX)] = None,
              q: Annotated[str | None, Query(max_length=NAME_MAX, description="Part of the name.")] = None,
              limit: Limit = 100, offset: Offset = 0) -> dict[str, Any]:
    statuses = [s.strip() for s in status.split(",") if s.strip()] if status else None
    for name, what in ((cluster, "cluster name"), (user, "user name")):
        if name:
            validate_name(name, what)
    rows, total = platform.run_summaries(statuses, cluster, limit, user=user, offset=offset, q=q or None)
    return {"runs": rows, "total": total}


@router.post("", status_code=201)
def submit_run(body: SubmitRun, who: CurrentUser, state: State, platform: TeamPlatform) -> dict[str, Any]:
    run = platform.create_run(body.spec, cluster=body.cluster, workdir=state.teams.home(who.team), user=who.user)
    state.audit.record(who, "submit", run.name, f"cluster {run.cluster}")
    return platform.describe_run(run.name)


@router.get("/{name}")
def describe_run(name: RunName, platform: TeamPlatform) -> dict[str, Any]:
    return platform.describe_run(name)


@router.post("/{name}/stop")
def stop_run(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform) -> dict[str, Any]:
    platform.stop_run(name)
    state.audit.record(who, "stop", name)
    return platform.describe_run(name)


@router.post("/{name}/restart")
def restart_run(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform,
                body: ClusterChoice | None = None) -> dict[str, Any]:
    cluster = body.cluster if body else None
    platform.restart_run(name, cluster)
    state.audit.record(who, "restart", name, f"cluster {cluster}" if cluster else "")
    return platform.describe_run(name)


@router.post("/{name}/move")
def move_run(name: RunName, body: MoveRun, who: CurrentUser, state: State, platform: TeamPlatform
             ) -> dict[str, Any]:
    platform.move_run(name, body.cluster)
    state.audit.record(who, "move", name, f"to cluster {body.cluster}")
    return platform.describe_run(name)


@router.post("/{name}/clone", status_code=201)
def clone_run(name: RunName, body: CloneRun, who: CurrentUser, state: State, platform: TeamPlatform
              ) -> dict[str, Any]:
    run = platform.clone_run(name, body.name, cluster=body.cluster, gpus=body.gpus, user=who.user)
    state.audit.record(who, "clone", name, f"as {run.name} on cluster {run.cluster}")
    return platform.describe_run(run.name)


@router.patch("/{name}")
def update_run(name: RunName, body: UpdateRun, who: CurrentUser, state: State, platform: TeamPlatform
               ) -> dict[str, Any]:
    changes = body.model_dump(exclude_none=True)
    platform.update_run(name, **changes)
    state.audit.record(who, "update", name, ", ".join(f"{k}={v}" for k, v in changes.items()))
    return platform.describe_run(name)


@router.delete("/{name}", status_code=204)
def delete_run(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform) -> Response:
    platform.delete_run(name)
    state.audit.record(who, "delete", name)
    return Response(status_code=204)
