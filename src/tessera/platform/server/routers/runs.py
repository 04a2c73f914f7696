"""Runs: list (a page at a time), submit, describe, and the lifecycle verbs (stop, restart, move, clone,
update, delete). Each handler is one call of the team's Platform inside its audit entry, which commits
in the change's own transaction (store/audit.py). Every answer is a model of api/models.py; a verb's is the run it returned, described
without reading it again (Platform.run_detail)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from tessera.platform.api.inputs import as_spec, cluster_of
from tessera.platform.api.models import (
    PAGE,
    CloneRun,
    ClusterChoice,
    MoveRun,
    RunDetail,
    RunPage,
    SubmitRun,
    UpdateRun,
)
from tessera.platform.api.sdk import Platform
from tessera.platform.runs.info import Run
from tessera.platform.server.auth import CurrentUser, State, TeamPlatform
from tessera.platform.server.params import Cursor, Limit, RunName, UserFilter
from tessera.platform.spec.schema import NAME_MAX, validate_name

router = APIRouter(prefix="/runs", tags=["runs"])


@router.get("")
def list_runs(platform: TeamPlatform, user: UserFilter,
              status: Annotated[str | None, Query(max_length=200, description="Comma-separated statuses.")] = None,
              cluster: Annotated[str | None, Query(max_length=NAME_MAX)] = None,
              q: Annotated[str | None, Query(max_length=NAME_MAX, description="Part of the name.")] = None,
              cursor: Cursor = None, limit: Limit = PAGE) -> RunPage:
    """The team's runs, newest first, a page at a time: pass `next_cursor` back as `cursor` for the next."""
    statuses = [s.strip() for s in status.split(",") if s.strip()] if status else None
    if cluster:
        validate_name(cluster, "cluster name")
    return platform.run_page(statuses, cluster, user=user, q=q or None, cursor=cursor, limit=limit)


def _detail(platform: Platform, run: Run, *, new: bool = False) -> RunDetail:
    """The run a verb returned, as `describe_run` answers (not read again)."""
    return RunDetail.model_validate(platform.run_detail(run, new=new))


@router.post("", status_code=201)
def submit_run(body: SubmitRun, who: CurrentUser, state: State, platform: TeamPlatform) -> RunDetail:
    spec = as_spec(body.spec)
    cluster = cluster_of(spec, body.cluster)
    # the entry's detail known before the change: written once, in the change's own transaction
    with state.audit.change(who, "submit", spec.name, f"cluster {cluster}"):
        run = platform.create_run(spec, cluster=cluster, workdir=state.teams.home(who.team), user=who.user)
    return _detail(platform, run, new=True)


@router.get("/{name}")
def describe_run(name: RunName, platform: TeamPlatform) -> RunDetail:
    return RunDetail.model_validate(platform.describe_run(name))


@router.post("/{name}/stop")
def stop_run(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform) -> RunDetail:
    with state.audit.change(who, "stop", name):
        run = platform.stop_run(name)
    return _detail(platform, run)


@router.post("/{name}/restart")
def restart_run(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform,
                body: ClusterChoice | None = None) -> RunDetail:
    cluster = body.cluster if body else None
    with state.audit.change(who, "restart", name, f"cluster {cluster}" if cluster else ""):
        run = platform.restart_run(name, cluster)
    return _detail(platform, run)


@router.post("/{name}/move")
def move_run(name: RunName, body: MoveRun, who: CurrentUser, state: State, platform: TeamPlatform) -> RunDetail:
    with state.audit.change(who, "move", name, f"to cluster {body.cluster}"):
        run = platform.move_run(name, body.cluster)
    return _detail(platform, run)


@router.post("/{name}/clone", status_code=201)
def clone_run(name: RunName, body: CloneRun, who: CurrentUser, state: State, platform: TeamPlatform
              ) -> RunDetail:
    with state.audit.change(who, "clone", name, f"as {body.name}") as entry:
        run = platform.clone_run(name, body.name, cluster=body.cluster, gpus=body.gpus, user=who.user)
        entry.detail = f"as {run.name} on cluster {run.cluster}"
    return _detail(platform, run)


@router.patch("/{name}")
def update_run(name: RunName, body: UpdateRun, who: CurrentUser, state: State, platform: TeamPlatform
               ) -> RunDetail:
    changes = body.model_dump(exclude_none=True)
    with state.audit.change(who, "update", name, ", ".join(f"{k}={v}" for k, v in changes.items())):
        run = platform.update_run(name, **changes)
    return _detail(platform, run)


@router.delete("/{name}", status_code=204, response_class=Response)
def delete_run(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform) -> Response:
    with state.audit.change(who, "delete", name):
        platform.delete_run(name)
    return Response(status_code=204)
