"""One supervisor pass over one active run: ask its cluster how the current resumption is doing and write
back what changed.

- No live resumption (PENDING, or the last one has ended): start one (submission.py).
- The job is queued or running: fold new heartbeats and events in; QUEUED -> RUNNING (the run and its
  resumption) as soon as the cluster reports the processes running; end the resumption gracefully (SIGTERM,
  `stop_grace`, then SIGKILL: STOPPING) on a request from the CLI/SDK (stop, move, restart) or on the
  supervisor's own decision (hang, max_duration, a GPU hardware fault in a node's log: gpu_health.py).
- The job has ended: COMPLETED, stopped, moved or restarted as requested, or a failure (retries.py).

Each pass decides from the database and the cluster alone, so it can be repeated after a crash.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tessera.platform.clusters import ClusterBackend, JobState, JobStatus
from tessera.platform.runs.metrics import read_metrics
from tessera.platform.runs.progress import describe_event, events_path, read_events, read_heartbeat
from tessera.platform.secrets.redaction import Redactor
from tessera.platform.spec.run_spec import RunSpec, format_duration
from tessera.platform.store.metric_points import add_points
from tessera.platform.store.state import (
    COMPLETED,
    PENDING,
    QUEUED,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    ResumptionRecord,
    RunRecord,
)
from tessera.platform.supervision.context import SupervisorContext
from tessera.platform.supervision.gpu_health import hardware_fault
from tessera.platform.supervision.retries import log_tail, resumption_failed
from tessera.platform.supervision.submission import start_resumption

REQUESTS = ("stop", "move", "restart")   # what the CLI/SDK may ask of an active run
UNMASKED = Redactor([])                  # API keys only: the shipped rows are masked already
GPU_SCAN_TAIL = 16 * 1024                # bytes of each node's log scanned for GPU faults at every pass


def step(ctx: SupervisorContext, run: RunRecord) -> None:
    """Advance `run` by what its cluster reports now."""
    res = ctx.db.current_resumption(run.id)
    if run.status == PENDING or res is None or res.end is not None:
        start_resumption(ctx, run, res)
        return
    spec = RunSpec.model_validate(run.spec)
    backend = ctx.backend(res.cluster)
    handle = dict(res.handle or {})
    status = backend.status(handle)
    now = time.time()
    changes: dict[str, Any] = {}
    if handle != (res.handle or {}):
        changes["handle"] = handle
    if status.nodes and status.nodes != res.nodes:
        changes["nodes"] = status.nodes
    folder = Path(res.folder)
    _read_progress(ctx, run, res, folder, changes, now)

    if not status.state.done:
        _while_running(ctx, run, res, spec, backend, handle, status.state, folder, changes, now)
        ship_output(ctx, run, res, final=False)   # after RUNNING is recorded: no reader sees a line first
        ingest_metrics(ctx, run)
        return
    ship_output(ctx, run, res, final=True)        # all of it before the end is recorded
    ingest_metrics(ctx, run)
    if changes:
        ctx.db.update_resumption(run.id, res.idx, **changes)
        res = ctx.db.current_resumption(run.id)
        assert res is not None
    _job_ended(ctx, run, res, spec, backend, handle, status, now)


def ship_output(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord, final: bool) -> None:
    """Ship what the resumption's processes wrote to its local folder since the last pass to the artifacts
    store, where every replica reads it (runs/shipping.py); `final`: they have ended, ship it all."""
    spec = RunSpec.model_validate(run.spec)
    backend, folder = ctx.backend(res.cluster), Path(res.folder)
    logs = [backend.log_path(folder, node) for node in range(spec.compute.nodes)]
    ctx.shipper.ship_resumption(ctx.artifacts, run.id, res.idx, folder, logs, ctx.secrets.redactor, final)


def ingest_metrics(ctx: SupervisorContext, run: RunRecord) -> None:
    """Store the metric points shipped since the last pass (store/metric_points.py). They were masked
    when shipped; readers mask them again with the secrets of their time (Platform.run_metrics)."""
    rows, position = read_metrics(ctx.artifacts, run.id, UNMASKED, run.metrics_next)
    if position != run.metrics_next:
        add_points(ctx.db, run.id, rows, position)


def _read_progress(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord, folder: Path,
                   changes: dict[str, Any], now: float) -> None:
    """Fold new heartbeats and events into the resumption."""
    heartbeat = folder / "heartbeat.json"
    beat = read_heartbeat(heartbeat)
    if beat is not None and beat != res.last_beat:
        changes.update(last_beat=beat, last_progress=now)
        if res.first_beat is None:
            changes["first_beat"] = beat
    events, offset = read_events(events_path(heartbeat), res.events_offset)
    if offset != res.events_offset:
        changes["events_offset"] = offset
        redact = ctx.secrets.redactor() if events else None
        for body in events:
            kind, message = describe_event(body)
            ctx.db.add_event(run.id, kind, redact(message) if redact else message,
                             at=float(body["time"]) if isinstance(body.get("time"), int | float) else None)


def _while_running(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord, spec: RunSpec,
                   backend: ClusterBackend, handle: dict[str, Any], state: JobState, folder: Path,
                   changes: dict[str, Any], now: float) -> None:
    run_changes: dict[str, Any] = {}
    request = run.request if run.request in REQUESTS else None
    if res.stop_sent is None:
        reason = request
        if reason is None and state is JobState.RUNNING:
            reason = _decide_stop(ctx, run, res, spec, backend, folder, now)
        if reason:
            handle["cancelled"] = True
            changes.update(stop_sent=now, stop_reason=reason, handle=handle)
            if state is JobState.QUEUED:
                backend.kill(handle)
            else:
                backend.terminate(handle)
            run_changes["status"] = STOPPING
            ctx.db.add_event(run.id, "stopping", f"{reason}: SIGTERM sent, SIGKILL after "
                             f"{format_duration(spec.scheduling.stop_grace)}")
    elif res.kill_sent is None and now - res.stop_sent > spec.scheduling.stop_grace + 2:
        backend.kill(handle)
        changes["kill_sent"] = now
        ctx.db.add_event(run.id, "killed", "still running after the grace period: SIGKILL sent")
    if state is JobState.RUNNING:
        _running(ctx, run, res, changes, run_changes, now)
    if changes:
        ctx.db.update_resumption(run.id, res.idx, **changes)
    if run_changes:
        ctx.db.update_run(run.id, **run_changes)


def _running(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord, changes: dict[str, Any],
             run_changes: dict[str, Any], now: float) -> None:
    """The cluster runs the job's processes: the resumption is RUNNING, and so is the run (unless it is
    STOPPING), from this pass on: not from its first log line or heartbeat, which a quiet command may
    never write. A run an older version left STARTING moves on too."""
    if res.start is None:
        changes["start"] = now
    if res.status != RUNNING:
        changes["status"] = RUNNING
    if run.status in (QUEUED, STARTING) and "status" not in run_changes:
        run_changes["status"] = RUNNING
        ctx.db.add_event(run.id, "running", f"resumption {res.idx} is running on "
                         f"{', '.join(changes.get('nodes') or res.nodes) or res.cluster}")


def _decide_stop(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord, spec: RunSpec,
                 backend: ClusterBackend, folder: Path, now: float) -> str | None:
    """'gpu_fault', 'hang' or 'max_duration' when the supervisor must end the resumption itself."""
    if spec.compute.gpus_per_node:
        # only nodes whose command runs: a failed pre-flight ends its node by itself (with its own exit code)
        running = [r for r in range(spec.compute.nodes)
                   if (folder / f"node-{r}.start").exists() and not (folder / f"node-{r}.exit").exists()]
        logs = {r: log_tail(backend.log_path(folder, r), GPU_SCAN_TAIL) for r in running}
        found = hardware_fault(logs)
        if found:
            rank, fault = found
            ctx.db.add_event(run.id, "gpu_fault", f"node {rank}: {fault.describe()}; ending the resumption")
            return "gpu_fault"
    hang_timeout = spec.scheduling.hang_timeout
    if hang_timeout and res.start is not None:
        reference = max(res.last_progress or 0.0, res.start)
        if now - reference > hang_timeout:
            ctx.db.add_event(run.id, "hang", f"no heartbeat for {format_duration(now - reference)} "
                             f"(hang_timeout {format_duration(hang_timeout)})")
            return "hang"
    max_duration = spec.scheduling.max_duration
    if max_duration and ctx.run_time(run, now) > max_duration:
        return "max_duration"
    return None


def _job_ended(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord, spec: RunSpec,
               backend: ClusterBackend, handle: dict[str, Any], status: JobStatus, now: float) -> None:
    """Record how the resumption ended and move the run on: done, PENDING again, or a failure to handle."""
    backend.cleanup(handle)
    end = {"end": now, "exit_code": status.exit_code, "status": status.state.value}
    if res.start is None:
        end["start"] = status.start or now
    reason = res.stop_reason
    if reason in REQUESTS:
        outcome = {"stop": "stopped", "move": "moved", "restart": "restarted"}[reason]
        ctx.db.update_resumption(run.id, res.idx, outcome=outcome, **end)
        if reason == "stop":
            ctx.finish(run, STOPPED, None)
        elif reason == "move":
            target = run.request_arg or run.cluster
            ctx.db.update_run(run.id, status=PENDING, cluster=target, request=None, request_arg=None,
                              next_cause=f"moved from {res.cluster} to {target}")
            ctx.db.add_event(run.id, "moved", f"stopped on {res.cluster}; resuming on {target}")
        else:
            ctx.db.update_run(run.id, status=PENDING, request=None, request_arg=None,
                              next_cause="restarted on request")
        return
    if status.state is JobState.COMPLETED:
        ctx.db.update_resumption(run.id, res.idx, outcome="completed", **end)
        ctx.finish(run, COMPLETED, None)
        return
    resumption_failed(ctx, run, res, spec, backend, status, end, now)
