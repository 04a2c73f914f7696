"""Runs: list, submit, describe, and the lifecycle verbs (stop, restart, move, clone, update, delete).
Each handler is one call of the team's Platform inside its audit entry (audit.py: written before the
change, done before the answer). A submit or clone picks the new run's id first, so its entry names it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from tessera.platform.api.inputs import as_spec
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
from tessera.platform.spec.run_spec import validate_name
from tessera.platform.store.state import new_run_id

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
    spec, run_id = as_spec(body.spec), new_run_id()
    with state.audit.change(who, "submit", spec.name, ref=run_id) as entry:
        run = platform.create_run(spec, cluster=body.cluster, workdir=state.teams.home(who.team), user=who.user,
                                  run_id=run_id)
        entry.detail = f"cluster {run.cluster}"
    return platform.describe_run(run.name)


@router.get("/{name}")
def describe_run(name: RunName, platform: TeamPlatform) -> dict[str, Any]:
    return platform.describe_run(name)


@router.post("/{name}/stop")
def stop_run(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform) -> dict[str, Any]:
    with state.audit.change(who, "stop", name):
        platform.stop_run(name)
    return platform.describe_run(name)


@router.post("/{name}/restart")
def restart_run(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform,
                body: ClusterChoice | None = None) -> dict[str, Any]:
    cluster = body.cluster if body else None
    with state.audit.change(who, "restart", name, f"cluster {cluster}" if cluster else ""):
        platform.restart_run(name, cluster)
    return platform.describe_run(name)


@router.post("/{name}/move")
def move_run(name: RunName, body: MoveRun, who: CurrentUser, state: State, platform: TeamPlatform
             ) -> dict[str, Any]:
    with state.audit.change(who, "move", name, f"to cluster {body.cluster}"):
        platform.move_run(name, body.cluster)
    return platform.describe_run(name)


@router.post("/{name}/clone", status_code=201)
def clone_run(name: RunName, body: CloneRun, who: CurrentUser, state: State, platform: TeamPlatform
              ) -> dict[str, Any]:
    run_id = new_run_id()
    with state.audit.change(who, "clone", name, f"as {body.name}", ref=run_id) as entry:
        run = platform.clone_run(name, body.name, cluster=body.cluster, gpus=body.gpus, user=who.user, run_id=run_id)
        entry.detail = f"as {run.name} on cluster {run.cluster}"
    return platform.describe_run(run.name)


@router.patch("/{name}")
def update_run(name: RunName, body: UpdateRun, who: CurrentUser, state: State, platform: TeamPlatform
               ) -> dict[str, Any]:
    changes = body.model_dump(exclude_none=True)
    with state.audit.change(who, "update", name, ", ".join(f"{k}={v}" for k, v in changes.items())):
        platform.update_run(name, **changes)
    return platform.describe_run(name)


@router.delete("/{name}", status_code=204)
def delete_run(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform) -> Response:
    with state.audit.change(who, "delete", name):
        platform.delete_run(name)
    return Response(status_code=204)
