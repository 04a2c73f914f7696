"""Taking over a run whose supervising replica was lost (its lease expired): reattach, or resume.

The run's current resumption is asked about as usual when this replica can reach its processes: a Slurm
or Kubernetes job from anywhere, a local process only on the host (and the boot) that started it. A job
that still lives is simply supervised from now on (reattached). A resumption whose processes are gone
without an exit status (they died with their supervisor's host, or a local process was killed with it),
or live where this replica cannot reach them, is ended as lost and the run resumes from its last
checkpoint with a new resumption whose cause says its supervisor was lost; such a resumption is not a
failure of the run and is not counted against its retries. A submission that was being made is left to
the next pass (submission.py adopts the job, or submits again).
"""

from __future__ import annotations

import time

from tessera.platform.clusters import JobState
from tessera.platform.clusters.base import hostname
from tessera.platform.store.leases import boot_id
from tessera.platform.store.state import PENDING, SUBMITTING, ResumptionRecord, RunRecord
from tessera.platform.supervision.context import SupervisorContext
from tessera.platform.supervision.run_pass import ship_output

LOST = "supervisor_lost"


def reachable(ctx: SupervisorContext, res: ResumptionRecord) -> bool:
    """Whether this replica can see and signal the resumption's processes."""
    if ctx.backend(res.cluster).type != "local":
        return True
    handle = res.handle or {}
    return list(handle.get("nodes") or []) == [hostname()] and handle.get("boot_id", boot_id()) == boot_id()


def take_over(ctx: SupervisorContext, run: RunRecord, previous: str) -> RunRecord:
    """Reconcile `run`, whose lease this replica just took from replica `previous`; returns it as stored."""
    res = ctx.db.current_resumption(run.id)
    was = f"replica {ctx.replica} took over the supervision of the run from replica {previous} (its lease expired)"
    if res is None or res.end is not None or res.status == SUBMITTING:
        ctx.db.add_event(run.id, "takeover", was)
        ctx.log(f"run {run.name}: {was}")
        return run
    here = reachable(ctx, res)
    if here:
        state = ctx.backend(res.cluster).status(dict(res.handle or {})).state
        if state is not JobState.LOST:
            ctx.db.add_event(run.id, "takeover", f"{was}; reattached to job {res.job_id} ({state.value})")
            ctx.log(f"run {run.name}: reattached to job {res.job_id} ({state.value}) of replica {previous}")
            return run
    ship_output(ctx, run, res, final=True)   # what the lost processes wrote here, before the end is recorded
    now = time.time()
    cause = f"its supervisor, replica {previous}, was lost; resumed from the last checkpoint"
    ctx.db.update_resumption(run.id, res.idx, status=JobState.LOST.value, end=now, start=res.start or now,
                             outcome=LOST, detail=f"the processes ended with their supervisor, replica {previous}"
                             if here else f"the processes ran where replica {ctx.replica} "
                             f"cannot reach them (host {', '.join(res.nodes) or '?'})")
    ctx.db.update_run(run.id, status=PENDING, next_cause=cause, not_before=None)
    ctx.db.add_event(run.id, "takeover", f"{was}; resumption {res.idx} was lost with it, resuming")
    ctx.log(f"run {run.name}: {cause}")
    record = ctx.db.get_run(run.id)
    assert record is not None
    return record
