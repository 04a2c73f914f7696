"""MCLI's run operations, each one call of the caller's team's Platform inside its audit entry, as the
REST API's routes make them (server/routers/runs.py): `createRun`, `getRunsPaginated`/`getRuns`,
`stopRuns`, `deleteRuns`, `updateRun`, `startRuns` (MCLI's restart).

`deleteRuns` is MosaicML's soft delete (Platform.delete_run(soft=True)): the run's files (folder, logs)
go as with `tessera run delete`, its record stays, marked deleted: `includeDeleted` lists it with
`isDeleted: true`, every other list and lookup (here, REST, console, CLI, SDK) leaves it out, and its
name may be given to a new run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strawberry.types import Info

from tessera.platform.api.sdk import Platform
from tessera.platform.server.accounts import Principal
from tessera.platform.server.graphql import types
from tessera.platform.server.graphql.context import Context, with_platform
from tessera.platform.server.graphql.inputs import (
    CreateRunInput,
    GetRunsInput,
    GetRunsPaginatedInput,
    StopRunsInput,
    UpdateRunInput,
)
from tessera.platform.server.graphql.run_input import to_mcli_yaml
from tessera.platform.server.graphql.selection import Selection, named, select_runs
from tessera.platform.server.graphql.views import run_view
from tessera.platform.server.state import ServerState
from tessera.platform.spec.mcli import priority_from_mcli, to_run_spec
from tessera.platform.store.state import TERMINAL

Ctx = Info[Context, Any]


async def get_runs_paginated(info: Ctx, get_runs_paginated_data: GetRunsPaginatedInput) -> types.RunsPage:
    data = get_runs_paginated_data

    def work(platform: Platform, who: Principal) -> types.RunsPage:
        found, cursor = select_runs(platform, Selection.of(data.filters, data.entity, who.user, data.include_deleted),
                                    data.limit, data.cursor)
        return types.RunsPage(cursor=cursor, has_next_page=cursor is not None, runs=[run_view(d) for d in found])

    return await with_platform(info, work)


async def get_runs(info: Ctx, get_runs_data: GetRunsInput) -> list[types.Run]:
    data = get_runs_data

    def work(platform: Platform, who: Principal) -> list[types.Run]:
        selection = Selection.of(data.filters, data.entity, who.user, data.include_deleted)
        return [run_view(d) for d in select_runs(platform, selection)[0]]

    return await with_platform(info, work)


async def create_run(info: Ctx, create_run_data: CreateRunInput) -> list[types.Run]:
    """The run YAML in MCLI's API spelling, read by spec/mcli.py as `tessera run submit -f` reads it."""
    state = info.context.state

    def work(platform: Platform, who: Principal) -> list[types.Run]:
        spec = to_run_spec(to_mcli_yaml(create_run_data.run_input), "createRun runInput")
        with state.audit.change(who, "submit", spec.name) as entry:
            run = platform.create_run(spec, workdir=state.teams.home(who.team), user=who.user)
            entry.detail = f"cluster {run.cluster}"
        return [run_view(platform.run_detail(run))]

    return await with_platform(info, work)


def _each(platform: Platform, who: Principal, state: ServerState, data: GetRunsInput, verb: str, action: str,
          apply: Callable[[str], object], *, detail: str = "", active_only: bool = False) -> list[types.Run]:
    """`apply(name)` to each run the operation names, inside its audit entry; the runs as they are after
    (a deleted one too, found by its id). `active_only`: a finished run is left as it is."""
    out = []
    for run in named(platform, data.filters, verb):
        if not (active_only and run["status"] in TERMINAL):
            with state.audit.change(who, action, run["name"], detail):
                apply(run["name"])
        out.append(run_view(platform.describe_run(run["id"], include_deleted=True)))
    return out


async def stop_runs(info: Ctx, get_runs_data: GetRunsInput, stop_runs_data: StopRunsInput | None = None
                    ) -> list[types.Run]:
    """Each named run stopped (a finished one is left as it is); `reason` goes into the audit entry."""
    state, reason = info.context.state, (stop_runs_data.reason if stop_runs_data else None) or ""
    return await with_platform(info, lambda platform, who: _each(
        platform, who, state, get_runs_data, "stopRuns", "stop", platform.stop_run, detail=reason, active_only=True))


async def start_runs(info: Ctx, get_runs_data: GetRunsInput) -> list[types.Run]:
    """`mcli run --restart NAME`: a finished run starts again (a new execution)."""
    state = info.context.state
    return await with_platform(info, lambda platform, who: _each(
        platform, who, state, get_runs_data, "startRuns", "restart", platform.restart_run))


async def delete_runs(info: Ctx, get_runs_data: GetRunsInput) -> list[types.Run]:
    """Each named run deleted (stopped first if active; soft: see the module), returned with `isDeleted: true`."""
    state = info.context.state
    return await with_platform(info, lambda platform, who: _each(
        platform, who, state, get_runs_data, "deleteRuns", "delete", lambda name: platform.delete_run(name, soft=True)))


def _changes(data: UpdateRunInput) -> dict[str, Any]:
    """Platform.update_run's arguments (MCLI's names and units to Tessera's)."""
    changes = {"priority": None if data.priority is None else priority_from_mcli(data.priority),
               "max_retries": data.max_retries, "preemptible": data.preemptible,
               "retry_on_system_failure": data.retry_on_system_failure,
               "max_duration": None if data.max_duration_seconds is None else float(data.max_duration_seconds)}
    return {k: v for k, v in changes.items() if v is not None}


async def update_run(info: Ctx, get_runs_data: GetRunsInput, update_run_data: UpdateRunInput) -> list[types.Run]:
    """`mcli update run NAME --priority/--max-retries/--max-duration/--[no-]preemptible`, and the SDK's
    `retry_on_system_failure` (Platform.update_run)."""
    state = info.context.state

    def work(platform: Platform, who: Principal) -> list[types.Run]:
        runs = named(platform, get_runs_data.filters, "updateRun")
        if len(runs) != 1:
            raise ValueError(f"updateRun changes one run; filters.name.in names {len(runs)}")
        name, changes = runs[0]["name"], _changes(update_run_data)
        if changes:
            with state.audit.change(who, "update", name, ", ".join(f"{k}={v}" for k, v in changes.items())):
                platform.update_run(name, **changes)
        return [run_view(platform.describe_run(name))]

    return await with_platform(info, work)
