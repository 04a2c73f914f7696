"""A Tessera run as MCLI reads one: its statuses in MCLI's words, its resumptions as MCLI's executions,
its spec as the run YAML it came from. Made from `Platform.describe_run`'s dict (the same one the REST
API answers, secret values already masked), so both APIs tell the same story about a run.

MCLI's client needs one execution at least (`resumptions[-1]`), so a run that has not started yet shows
execution 0 with the run's status and no start time, as MosaicML's API does for a queued run.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tessera.platform.server.graphql import types
from tessera.platform.server.graphql.run_input import mcli_priority, original_run_input
from tessera.platform.spec.run_spec import RunSpec

MCLI_STATUSES = ("PENDING", "QUEUED", "STARTING", "RUNNING", "TERMINATING", "COMPLETED", "STOPPED", "FAILED",
                 "UNKNOWN")
_TO_MCLI = {"STOPPING": "TERMINATING", "SUBMITTING": "STARTING"}
_FROM_MCLI = {"TERMINATING": ("STOPPING",), "UNKNOWN": ()}
_STOPPED_OUTCOMES = ("stopped", "moved", "restarted")


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()


def mcli_status(status: str) -> str:
    status = _TO_MCLI.get(status, status)
    return status if status in MCLI_STATUSES else "UNKNOWN"


def tessera_statuses(mcli: list[str]) -> tuple[str, ...]:
    """The Tessera statuses MCLI's status filter means (its names, any case: `Running`, `TERMINATING`)."""
    out: list[str] = []
    for value in mcli:
        name = value.strip().upper()
        if name not in MCLI_STATUSES:
            raise ValueError(f"status filter: {value!r} is not one of {', '.join(MCLI_STATUSES)}")
        out.extend(_FROM_MCLI.get(name, (name,)))
    return tuple(dict.fromkeys(out))


def _execution_status(res: dict[str, Any], run_status: str, latest: bool) -> str:
    """How a resumption ended (its outcome), or, while it runs, the run's status."""
    if res["end"] is None:
        return mcli_status(run_status) if latest else "UNKNOWN"
    if res["outcome"] == "completed" or (res["outcome"] is None and res["status"] == "COMPLETED"):
        return "COMPLETED"
    return "STOPPED" if res["outcome"] in _STOPPED_OUTCOMES else "FAILED"


def _shape(spec: RunSpec) -> tuple[int, int, str, int]:
    """(GPUs, CPUs, GPU type, nodes) of the whole run, in MCLI's terms (GPU type "None" for a CPU run)."""
    c = spec.compute
    return (c.gpus_per_node * c.nodes, (c.cpus_per_node or 0) * c.nodes, c.gpu_type or "None", c.nodes)


def _executions(run: dict[str, Any]) -> list[dict[str, Any]]:
    found = run["resumptions"]
    if found:
        return found
    return [{"index": 0, "cluster": run["cluster"], "status": run["status"], "start": None, "end": None,
             "outcome": None, "detail": run["first_error"], "submitted": run["created"], "nodes": []}]


def _event_index(t: float, executions: list[dict[str, Any]]) -> int:
    index = executions[0]["index"]
    for res in executions:
        if res["submitted"] <= t:
            index = res["index"]
    return index


def run_view(run: dict[str, Any]) -> types.Run:
    """The run as MCLI's `Run` (every field its queries select, details included); `isDeleted` for a run
    deleted through this API (its record is kept)."""
    spec = RunSpec.model_validate(run["spec"])
    gpus, cpus, gpu_type, nodes = _shape(spec)
    executions = _executions(run)
    last = executions[-1]["index"]
    resumptions = [types.Resumption(
        cluster_name=res["cluster"], cpus=cpus, gpu_type=gpu_type, gpus=gpus, nodes=nodes, execution_index=res["index"],
        start_time=iso(res["start"]), end_time=iso(res["end"]),
        status=_execution_status(res, run["status"], res["index"] == last), estimated_end_time=None,
        reason=res.get("detail") or (run["first_error"] if res["index"] == last else None))
        for res in executions]
    lifecycle = [types.Lifecycle(execution_index=r.execution_index, status=r.status,
                                 start_time=r.start_time or iso(res["submitted"]) or "", end_time=r.end_time,
                                 reason=r.reason) for r, res in zip(resumptions, executions, strict=True)]
    latest = resumptions[-1]
    details = types.RunDetails(
        image=spec.image, original_run_input=original_run_input(spec, run["cluster"]), metadata=spec.metadata,
        last_execution_id=f"{run['id']}-{last}",
        lifecycle=lifecycle,
        nodes=[types.RunNode(rank=i, name=host, status=latest.status, reason=latest.reason)
               for i, host in enumerate(executions[-1]["nodes"])],
        formatted_run_events=[types.RunEvent(resumption_index=_event_index(e["time"], executions),
                                             event_type=e["kind"], event_time=iso(e["time"]) or "",
                                             event_message=e["message"]) for e in run["events"]])
    duration = spec.scheduling.max_duration
    return types.Run(
        id=run["id"], name=run["name"], status=mcli_status(run["status"]), created_at=iso(run["created"]) or "",
        updated_at=iso(run["updated"]) or "", reason=run["first_error"], created_by_email=run["user"] or "",
        priority=mcli_priority(spec.scheduling.priority), max_retries=spec.scheduling.max_retries,
        preemptible=spec.scheduling.preemptible, retry_on_system_failure=spec.scheduling.retry_on_system_failure,
        max_duration_seconds=None if duration is None else int(duration), is_deleted=run.get("deleted") is not None, run_type="TRAINING",
        resumptions=resumptions, details=details)
