"""Starting a resumption: from a PENDING run to a submitted job, without ever orphaning one or running
two.

The resumption's row is written (SUBMITTING, no job id) *before* the job is submitted, and the job id is
stored after. A supervisor killed in between leaves that row; the next one asks the cluster for the job
by its name or folder (`ClusterBackend.find`) and adopts it, or drops the row and submits again. A
cluster that cannot answer is asked again on the next pass, never resubmitted blindly. A run whose gang
no longer fits outside the excluded nodes fails with that cause instead of waiting forever
(placement.py).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from tessera.platform.clusters import ClusterBackend, LaunchRequest
from tessera.platform.errors import ClusterError, PlatformError
from tessera.platform.runs.folder import local_run_folder
from tessera.platform.runs.metrics import METRICS_FILE
from tessera.platform.spec.run_spec import RunSpec
from tessera.platform.store.leases import boot_id
from tessera.platform.store.state import FAILED, STOPPED, SUBMITTING, ResumptionRecord, RunRecord
from tessera.platform.supervision.context import SupervisorContext
from tessera.platform.supervision.integrations import node_postmortem, node_prelude, node_workdir
from tessera.platform.supervision.placement import too_few_nodes
from tessera.platform.supervision.retries import retry_submission


def start_resumption(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord | None) -> None:
    """A run with no live resumption (`res` is its last one, or None): adopt a half-made submission,
    act on a request that came before the start, or submit the next resumption once its delay is over."""
    now = time.time()
    if res is not None and res.status == SUBMITTING:
        if _adopt(ctx, run, res):
            return
        res = ctx.db.current_resumption(run.id)
    if run.request == "stop":
        ctx.finish(run, STOPPED, "stopped before it started")
        return
    if run.request in ("move", "restart"):
        fields: dict[str, Any] = {"request": None, "request_arg": None}
        if run.request == "move" and run.request_arg:
            fields.update(cluster=run.request_arg, next_cause=f"moved from {run.cluster} to {run.request_arg}")
        ctx.db.update_run(run.id, **fields)
        return
    if run.not_before and now < run.not_before:
        return
    spec = RunSpec.model_validate(run.spec)
    idx = 0 if res is None else res.idx + 1
    cause = run.next_cause or ("submitted" if idx == 0 else "resumed")
    local = local_run_folder(ctx.home, run.folder, run.id)   # on this replica's host
    folder = local / f"r{idx}"
    try:
        backend = ctx.backend(run.cluster)
        backend.check(spec)
        request = _launch_request(ctx, run, spec, idx, folder, now)
    except PlatformError as exc:
        ctx.finish(run, FAILED, f"cannot start on {run.cluster}: {exc}", kind="config")
        return
    problem = too_few_nodes(backend, spec.compute.nodes, ctx.db.node_faults(run.cluster))
    if problem:
        ctx.finish(run, FAILED, f"cannot start on {run.cluster}: {problem}", kind="insufficient_nodes")
        return
    ctx.artifacts.place_run_files(run.id, spec, local)   # parameters.yaml, where another replica took the run
    if idx == 0:     # before the first resumption exists: a takeover that launches it again puts them again
        ctx.artifacts.put_run_files(run.id, spec)
    folder.mkdir(parents=True, exist_ok=True)
    # The intent first: if this process dies after sbatch succeeded but before the job id is stored,
    # the next supervisor finds the job by this row (`_adopt`) instead of orphaning it.
    ctx.db.add_resumption(ResumptionRecord(run.id, idx, run.cluster, cause, SUBMITTING, str(folder), now))
    try:
        handle = backend.submit(request)
    except ClusterError as exc:
        try:
            found = backend.find(request)   # e.g. sbatch timed out after slurmctld had taken the job
        except ClusterError:
            return                          # the intent stays; the next pass asks the cluster again
        if found is None:
            ctx.db.delete_resumption(run.id, idx)
            retry_submission(ctx, run, spec, exc)
            return
        handle = found
    ctx.db.record_submission(run.id, idx, stamped(backend, handle))
    excluded = f", excluding {', '.join(request.exclude)}" if request.exclude else ""
    ctx.db.add_event(run.id, "submitted", f"resumption {idx} submitted to {run.cluster} as job "
                     f"{handle.get('job_id')} ({cause}{excluded})")
    ctx.log(f"run {run.name}: resumption {idx} -> {run.cluster} job {handle.get('job_id')}")


def _adopt(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord) -> bool:
    """A SUBMITTING resumption: a supervisor died while submitting it. Adopt its job if the cluster
    has one (True), else forget the intent so it is submitted again (False). A cluster that cannot
    tell raises, and the next pass asks again: submitting twice would run two trainers at once."""
    spec = RunSpec.model_validate(run.spec)
    backend = ctx.backend(res.cluster)
    request = _launch_request(ctx, run, spec, res.idx, Path(res.folder), time.time())
    handle = backend.find(request)
    was = f"resumption {res.idx} was being submitted to {res.cluster} when the supervisor stopped"
    if handle is None:
        ctx.db.delete_resumption(run.id, res.idx)
        ctx.db.add_event(run.id, "reconciled", f"{was}, and no job was created: submitting it again")
        return False
    ctx.db.record_submission(run.id, res.idx, stamped(backend, handle))
    ctx.db.add_event(run.id, "reconciled", f"{was}: found it as job {handle.get('job_id')} and adopted it")
    ctx.log(f"run {run.name}: adopted job {handle.get('job_id')} of resumption {res.idx}")
    return True


def stamped(backend: ClusterBackend, handle: dict[str, Any]) -> dict[str, Any]:
    """A local job's handle names the boot it runs in: after a reboot its pid names another process, and
    a replica that takes the run over must not take that one for it (takeover.py)."""
    return {**handle, "boot_id": boot_id()} if backend.type == "local" else handle


def _launch_request(ctx: SupervisorContext, run: RunRecord, spec: RunSpec, idx: int, folder: Path,
                    now: float) -> LaunchRequest:
    names = [info.name for info in ctx.secrets.list()] if spec.all_secrets else spec.secrets
    injection = ctx.secrets.injection(names, folder)
    env = _run_env(run, spec, idx, folder)
    time_limit = None
    if spec.scheduling.max_duration:
        time_limit = max(60.0, spec.scheduling.max_duration - ctx.run_time(run, now))
    return LaunchRequest(run.id, run.name, idx, folder, spec, env, dict(injection.env), injection.files,
                         exclude=ctx.db.excluded_nodes(run.cluster), time_limit=time_limit,
                         workdir=run.workdir, prelude=node_prelude(spec), node_workdir=node_workdir(spec),
                         postmortem=node_postmortem(spec))


def _run_env(run: RunRecord, spec: RunSpec, idx: int, folder: Path) -> dict[str, str]:
    """What Tessera injects into every run (docs/platform.md); the spec's env comes first, so these win."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    env = {**spec.env, "RUN_NAME": run.name, "TESSERA_RUN_ID": run.id, "TESSERA_RESUMPTION": str(idx),
           "TESSERA_HEARTBEAT": str(folder / "heartbeat.json"),
           "TESSERA_PARAMETERS": str(folder.parent / "parameters.yaml"),
           "TESSERA_METRICS": str(folder / METRICS_FILE),   # per resumption: shipped in turn to the run's
           # the run finds `tessera` and `python` of the environment that submitted it
           "PATH": path if bin_dir in path.split(os.pathsep) else f"{bin_dir}{os.pathsep}{path}"}
    if spec.scheduling.hang_timeout:
        env["TESSERA_HEARTBEAT_INTERVAL"] = f"{min(30.0, spec.scheduling.hang_timeout / 4):g}"
    return env
