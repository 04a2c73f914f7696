"""A resumption failed, or its submission did: gather the evidence, classify it (`failures.classify`),
exclude the nodes it implicates, and retry the run or fail it.

Classification is pure and lives in failures.py; this module owns what the supervisor does about it:
the retry budgets (counted retries up to `max_retries`, system failures uncounted up to
MAX_SYSTEM_RETRIES), the backoff between attempts and the node faults it records.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tessera.platform.clusters import ClusterBackend, JobState, JobStatus
from tessera.platform.errors import ClusterError, PlatformError
from tessera.platform.secrets.vault import Redactor
from tessera.platform.spec.run_spec import RunSpec, format_duration
from tessera.platform.store.state import FAILED, PENDING, ResumptionRecord, RunRecord
from tessera.platform.supervision.context import SupervisorContext
from tessera.platform.supervision.failures import Action, Evidence, Failure, FailureKind, classify
from tessera.platform.supervision.gpu_health import read_preflight

MAX_SYSTEM_RETRIES = 20      # node faults and preemptions retried without counting, up to this many
LOG_TAIL = 64 * 1024         # bytes of each node's log read for classification


def backoff(ctx: SupervisorContext, attempt: int) -> float:
    """Seconds to wait before counted retry `attempt` (1, 2, ...): doubling, at most 300 s."""
    return min(300.0, ctx.settings.retry_backoff * 2 ** max(0, attempt - 1))


def retry_submission(ctx: SupervisorContext, run: RunRecord, spec: RunSpec, exc: ClusterError) -> None:
    """The cluster refused a submission and holds no job for it: try again later (counted), or fail."""
    if run.retries_used >= spec.scheduling.max_retries:
        ctx.finish(run, FAILED, f"submission to {run.cluster} failed: {exc}", kind="submit")
        return
    delay = backoff(ctx, run.retries_used + 1)
    ctx.db.update_run(run.id, retries_used=run.retries_used + 1, not_before=time.time() + delay)
    ctx.db.add_event(run.id, "submit_failed", f"submission failed, retrying in {delay:g} s: {exc}")


def resumption_failed(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord, spec: RunSpec,
                      backend: ClusterBackend, status: JobStatus, end: dict[str, Any], now: float) -> None:
    """The job ended neither completed nor on request: record why (`end` holds the resumption's end
    fields), then retry or fail the run."""
    redact = ctx.secrets.redactor()
    if res.stop_reason == "max_duration":
        summary = f"exceeded max_duration {format_duration(spec.scheduling.max_duration)}"
        ctx.db.update_resumption(run.id, res.idx, outcome=FailureKind.TIMEOUT.value, detail=summary, **end)
        ctx.finish(run, FAILED, summary, kind=FailureKind.TIMEOUT.value)
        return
    failure = _on_one_node(classify(_evidence(ctx, res, spec, backend, status, now)), backend)
    ctx.db.update_resumption(run.id, res.idx, outcome=failure.kind.value, detail=redact(failure.summary), **end)
    gpu = f" [{failure.gpu_fault}]" if failure.gpu_fault else ""
    ctx.db.add_event(run.id, "failure", redact(f"resumption {res.idx} failed: {failure.kind.value}{gpu}: "
                                               f"{failure.summary}"))
    _mark_nodes(ctx, run, res, failure)
    _decide(ctx, run, spec, failure, redact)


def _on_one_node(failure: Failure, backend: ClusterBackend) -> Failure:
    """The local cluster is one node: a GPU fault there cannot be excluded and would come back at every
    system retry, so the run fails with the reason instead."""
    if backend.type != "local" or not (failure.hard and failure.gpu_fault):
        return failure
    return replace(failure, action=Action.FAIL, summary=f"{failure.summary}; the local cluster is this one "
                   "machine, so there is no other node to run on: repair the GPU, then `tessera run restart`")


def log_tail(path: Path, size: int = LOG_TAIL) -> str:
    """The last `size` bytes of a node's log (what classification reads), "" when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _evidence(ctx: SupervisorContext, res: ResumptionRecord, spec: RunSpec, backend: ClusterBackend,
              status: JobStatus, now: float) -> Evidence:
    folder = Path(res.folder)
    logs = {r: log_tail(backend.log_path(folder, r)) for r in range(spec.compute.nodes)}
    seen = ctx.unhealthy.get(res.cluster, {})
    since = (res.start or res.submitted) - 5
    unhealthy = {n for n, t in seen.items() if t >= since}
    if status.state is JobState.NODE_FAIL:
        try:
            unhealthy |= {n.name for n in backend.nodes() if not n.healthy}
        except PlatformError:
            pass
    nodes = status.nodes or res.nodes
    by_rank = [e.node for e in status.node_exits] if len(status.node_exits) == spec.compute.nodes else nodes
    first, last = res.first_beat or {}, res.last_beat or {}
    if last:
        made_progress = last.get("step") != first.get("step") or bool(
            last.get("last_checkpoint") and last.get("last_checkpoint") != first.get("last_checkpoint"))
    else:
        made_progress = now - (res.start or now) > ctx.settings.early_window
    return Evidence(status.state, status.exit_code, status.node_exits, logs, list(by_rank),
                    sorted(unhealthy & set(nodes)) if nodes else sorted(unhealthy), made_progress,
                    hang=res.stop_reason == "hang", preflight=read_preflight(folder))


def _mark_nodes(ctx: SupervisorContext, run: RunRecord, res: ResumptionRecord, failure: Failure) -> None:
    if ctx.backend(res.cluster).type == "local":
        return   # one node: excluding it would leave nowhere to run
    for node in failure.nodes:
        faults, excluded = ctx.db.record_node_fault(res.cluster, node, f"{failure.kind.value} in run "
                                                    f"{run.name}", hard=failure.hard)
        if excluded:
            ctx.db.add_event(run.id, "node_excluded", f"node {node} of {res.cluster} excluded from later "
                             f"submissions ({faults} fault(s), last: {failure.kind.value})")


def _decide(ctx: SupervisorContext, run: RunRecord, spec: RunSpec, failure: Failure, redact: Redactor) -> None:
    sched = spec.scheduling
    kind, summary = failure.kind.value, redact(failure.summary)
    first_error = redact(failure.first_error) if failure.first_error else None
    if failure.action is Action.FAIL:
        ctx.finish(run, FAILED, summary, kind=kind, first_error=first_error)
        return
    fields: dict[str, Any] = {}
    if failure.system and sched.retry_on_system_failure and run.system_retries < MAX_SYSTEM_RETRIES:
        fields["system_retries"] = run.system_retries + 1
        delay = 0.0
    elif run.retries_used < sched.max_retries:
        fields["retries_used"] = run.retries_used + 1
        delay = backoff(ctx, run.retries_used + 1)
    else:
        used = run.retries_used
        ctx.finish(run, FAILED, f"gave up after {used} retr{'y' if used == 1 else 'ies'}: {summary}",
                   kind=kind, first_error=first_error)
        return
    ctx.db.update_run(run.id, status=PENDING, next_cause=f"retry after {kind}: {summary}",
                      not_before=time.time() + delay, **fields)
    ctx.db.add_event(run.id, "retry", f"retrying ({kind})" + (f" in {delay:g} s" if delay else ""))
