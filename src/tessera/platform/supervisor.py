"""The supervisor: one long-running process per TESSERA_HOME that keeps runs alive.

It is started detached (its own session) by the CLI or SDK when a run needs watching, holds
`supervisor.lock` (flock) so only one runs, and keeps nothing in memory that matters: every pass reads
the runs from SQLite, asks each run's cluster how its current resumption is doing, and writes back what
changed. Killed and restarted, it picks up where it was. It exits after `idle_exit` seconds with nothing
to watch.

One pass over an active run:
- PENDING: start a resumption (a gang job on the run's cluster), with RUN_NAME, TESSERA_RUN_ID,
  TESSERA_RESUMPTION, TESSERA_HEARTBEAT and TESSERA_PARAMETERS injected -> QUEUED. The resumption row is
  written (SUBMITTING) before the job is submitted, so a supervisor killed in between finds the job by
  its name or folder on restart and adopts it (`_reconcile`); a run whose gang no longer fits outside
  the excluded nodes fails with that cause instead of waiting forever (placement.py).
- QUEUED -> STARTING when the processes are up -> RUNNING at the first heartbeat or log output.
- Requests from the CLI/SDK (stop, move, restart) and its own decisions (hang, max_duration) end the
  resumption gracefully: SIGTERM, `stop_grace`, then SIGKILL (STOPPING).
- When the job has ended: COMPLETED, or classify the failure (`failures.classify`) and retry (a new
  PENDING resumption with its cause), exclude the implicated nodes and retry, or fail.

    python -m tessera.platform.supervisor [--home DIR]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.platform.clusters import LOCAL, ClusterBackend, JobState, LaunchRequest, make_backend
from tessera.platform.errors import ClusterError, PlatformError
from tessera.platform.failures import Action, Evidence, Failure, FailureKind, classify
from tessera.platform.home import tessera_home
from tessera.platform.placement import too_few_nodes
from tessera.platform.progress import describe_event, events_path, read_events, read_heartbeat
from tessera.platform.secrets import Redactor, SecretStore
from tessera.platform.spec import RunSpec, format_duration
from tessera.platform.state import (
    ACTIVE,
    COMPLETED,
    FAILED,
    PENDING,
    QUEUED,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    SUBMITTING,
    ResumptionRecord,
    RunRecord,
    StateDB,
)

MAX_SYSTEM_RETRIES = 20      # node faults and preemptions retried without counting, up to this many
LOG_TAIL = 64 * 1024         # bytes of each node's log read for classification


@dataclass
class SupervisorSettings:
    """Tunables, from the environment of whoever starts the supervisor (tests shorten them)."""
    poll: float = 1.0            # seconds between passes
    idle_exit: float = 300.0     # exit after this long with no active run
    retry_backoff: float = 2.0   # first retry delay in seconds; doubles per retry, capped at 300 s
    early_window: float = 300.0  # a run without heartbeats "made progress" once it ran this long
    fault: str = ""              # tests only: die at this point of a submission (`_fault_point`)

    @classmethod
    def from_env(cls) -> SupervisorSettings:
        def get(name: str, default: float) -> float:
            return float(os.environ.get(name, default))
        return cls(poll=get("TESSERA_SUPERVISOR_POLL", 1.0), idle_exit=get("TESSERA_SUPERVISOR_IDLE", 300.0),
                   retry_backoff=get("TESSERA_RETRY_BACKOFF", 2.0),
                   early_window=get("TESSERA_EARLY_WINDOW", 300.0),
                   fault=os.environ.get("TESSERA_SUPERVISOR_FAULT", ""))


def cluster_backend(db: StateDB, name: str) -> ClusterBackend:
    record = db.get_cluster(name)
    if record is None:
        if name == LOCAL:
            return make_backend(LOCAL, "local", {})
        known = ", ".join([LOCAL, *(c.name for c in db.list_clusters() if c.name != LOCAL)])
        raise ClusterError(f"cluster {name!r} is not known (known: {known}); add it with "
                           f"`tessera cluster add {name} --type slurm ...`")
    return make_backend(record.name, record.type, record.config)


def _tail(path: Path, size: int = LOG_TAIL) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


class Supervisor:
    def __init__(self, home: str | Path | None = None, settings: SupervisorSettings | None = None) -> None:
        self.home = tessera_home(home)
        self.settings = settings or SupervisorSettings.from_env()
        self.db = StateDB(self.home)
        self.secrets = SecretStore(self.home)
        self.backends: dict[str, ClusterBackend] = {}
        self.unhealthy: dict[str, dict[str, float]] = {}   # cluster -> node -> last time seen unhealthy
        self.last_error: dict[str, str] = {}                # run id -> last error recorded as an event
        self.started = time.time()
        self._stop = False

    # --- main loop --------------------------------------------------------------------------------

    def log(self, message: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}", file=sys.stderr, flush=True)

    def run_forever(self) -> int:
        lock = _try_lock(self.home)
        if lock is None:
            self.log("another supervisor holds the lock; exiting")
            return 0
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        (self.home / "supervisor.pid").write_text(str(os.getpid()))
        self.log(f"supervisor {os.getpid()} watching {self.home}")
        idle_since = time.monotonic()
        try:
            while not self._stop:
                active = self.tick()
                now = time.monotonic()
                if active:
                    idle_since = now
                elif now - idle_since > self.settings.idle_exit:
                    # Release first, then look again: a run submitted meanwhile either sees the lock free
                    # (and starts a new supervisor) or is seen here.
                    os.close(lock)
                    if not self.db.list_runs(ACTIVE):
                        self.log("nothing to watch; exiting")
                        return 0
                    lock = _try_lock(self.home)
                    if lock is None:
                        return 0
                    idle_since = now
                time.sleep(self.settings.poll)
        finally:
            try:
                if (self.home / "supervisor.pid").read_text() == str(os.getpid()):
                    (self.home / "supervisor.pid").unlink()
            except OSError:
                pass
        self.log("stopped by SIGTERM")
        return 0

    def tick(self) -> int:
        """One pass over every active run; returns how many are active."""
        self.db.supervisor_beat(os.getpid(), self.started)
        runs = self.db.list_runs(ACTIVE)
        self._watch_nodes(runs)
        for run in sorted(runs, key=lambda r: r.created):
            try:
                self.step(run)
                self.last_error.pop(run.id, None)
            except Exception as exc:  # one broken run must not stop the others being watched
                message = f"{type(exc).__name__}: {exc}"
                if self.last_error.get(run.id) != message:   # once per distinct error, not every pass
                    self.last_error[run.id] = message
                    self.log(f"run {run.name}: {exc!r}\n{traceback.format_exc()}")
                    self.db.add_event(run.id, "supervisor_error", f"supervisor error (will retry): {message}")
        return len(runs)

    def backend(self, name: str) -> ClusterBackend:
        if name not in self.backends:
            self.backends[name] = cluster_backend(self.db, name)
        return self.backends[name]

    def _watch_nodes(self, runs: list[RunRecord]) -> None:
        """Remember which nodes look unhealthy, to name the culprit when a job ends in NODE_FAIL."""
        for cluster in {r.cluster for r in runs if r.status in (STARTING, RUNNING, STOPPING)}:
            try:
                backend = self.backend(cluster)
                if backend.type == "local":
                    continue
                seen = self.unhealthy.setdefault(cluster, {})
                for node in backend.nodes():
                    if not node.healthy:
                        seen[node.name] = time.time()
            except PlatformError:
                continue

    # --- one run ----------------------------------------------------------------------------------

    def step(self, run: RunRecord) -> None:
        res = self.db.current_resumption(run.id)
        if run.status == PENDING or res is None or res.end is not None:
            self._pending(run, res)
            return
        spec = RunSpec.model_validate(run.spec)
        backend = self.backend(res.cluster)
        handle = dict(res.handle or {})
        status = backend.status(handle)
        now = time.time()
        changes: dict[str, Any] = {}
        if handle != (res.handle or {}):
            changes["handle"] = handle
        if status.nodes and status.nodes != res.nodes:
            changes["nodes"] = status.nodes
        folder = Path(res.folder)
        progressed = self._read_progress(run, res, folder, changes, now)

        if not status.state.done:
            self._while_running(run, res, spec, backend, handle, status.state, folder, progressed, changes, now)
            return
        if changes:
            self.db.update_resumption(run.id, res.idx, **changes)
            res = self.db.current_resumption(run.id)
            assert res is not None
        self._ended(run, res, spec, backend, handle, status, now)

    def _read_progress(self, run: RunRecord, res: ResumptionRecord, folder: Path, changes: dict[str, Any],
                       now: float) -> bool:
        """Fold new heartbeats and events into the resumption; True if a new heartbeat arrived."""
        heartbeat = folder / "heartbeat.json"
        beat = read_heartbeat(heartbeat)
        progressed = False
        if beat is not None and beat != res.last_beat:
            changes.update(last_beat=beat, last_progress=now)
            if res.first_beat is None:
                changes["first_beat"] = beat
            progressed = True
        events, offset = read_events(events_path(heartbeat), res.events_offset)
        if offset != res.events_offset:
            changes["events_offset"] = offset
            redact = self.secrets.redactor() if events else None
            for body in events:
                kind, message = describe_event(body)
                self.db.add_event(run.id, kind, redact(message) if redact else message,
                                  at=float(body["time"]) if isinstance(body.get("time"), int | float) else None)
        return progressed

    def _while_running(self, run: RunRecord, res: ResumptionRecord, spec: RunSpec, backend: ClusterBackend,
                       handle: dict[str, Any], state: JobState, folder: Path, progressed: bool,
                       changes: dict[str, Any], now: float) -> None:
        run_changes: dict[str, Any] = {}
        request = run.request if run.request in ("stop", "move", "restart") else None
        if res.stop_sent is None:
            reason = request
            if reason is None and state is JobState.RUNNING:
                reason = self._decide_stop(run, res, spec, now)
            if reason:
                handle["cancelled"] = True
                changes.update(stop_sent=now, stop_reason=reason, handle=handle)
                if state is JobState.QUEUED:
                    backend.kill(handle)
                else:
                    backend.terminate(handle)
                run_changes["status"] = STOPPING
                self.db.add_event(run.id, "stopping", f"{reason}: SIGTERM sent, SIGKILL after "
                                  f"{format_duration(spec.scheduling.stop_grace)}")
        elif res.kill_sent is None and now - res.stop_sent > spec.scheduling.stop_grace + 2:
            backend.kill(handle)
            changes["kill_sent"] = now
            self.db.add_event(run.id, "killed", "still running after the grace period: SIGKILL sent")
        if state is JobState.RUNNING and res.start is None:
            changes["start"] = now
            if run.status == QUEUED:
                run_changes["status"] = STARTING
        if run.status in (QUEUED, STARTING) and "status" not in run_changes and state is JobState.RUNNING:
            if progressed or res.last_beat or self._has_output(folder):
                run_changes["status"] = RUNNING
                self.db.add_event(run.id, "running", f"resumption {res.idx} is running on "
                                  f"{', '.join(changes.get('nodes') or res.nodes) or res.cluster}")
        if changes:
            self.db.update_resumption(run.id, res.idx, **changes)
        if run_changes:
            self.db.update_run(run.id, **run_changes)

    def _decide_stop(self, run: RunRecord, res: ResumptionRecord, spec: RunSpec, now: float) -> str | None:
        """'hang' or 'max_duration' when the supervisor must end the resumption itself."""
        hang_timeout = spec.scheduling.hang_timeout
        if hang_timeout and res.start is not None:
            reference = max(res.last_progress or 0.0, res.start)
            if now - reference > hang_timeout:
                self.db.add_event(run.id, "hang", f"no heartbeat for {format_duration(now - reference)} "
                                  f"(hang_timeout {format_duration(hang_timeout)})")
                return "hang"
        max_duration = spec.scheduling.max_duration
        if max_duration and self._run_time(run, now) > max_duration:
            return "max_duration"
        return None

    def _run_time(self, run: RunRecord, now: float) -> float:
        total = 0.0
        for r in self.db.resumptions(run.id):
            if r.start is not None:
                total += (r.end or now) - r.start
        return total

    @staticmethod
    def _has_output(folder: Path) -> bool:
        return any(p.stat().st_size > 0 for p in folder.glob("node-*.log"))

    # --- starting ---------------------------------------------------------------------------------

    def _pending(self, run: RunRecord, res: ResumptionRecord | None) -> None:
        now = time.time()
        if res is not None and res.status == SUBMITTING:
            if self._reconcile(run, res):
                return
            res = self.db.current_resumption(run.id)
        if run.request == "stop":
            self._finish(run, STOPPED, "stopped before it started")
            return
        if run.request in ("move", "restart"):
            fields: dict[str, Any] = {"request": None, "request_arg": None}
            if run.request == "move" and run.request_arg:
                fields.update(cluster=run.request_arg, next_cause=f"moved from {run.cluster} to {run.request_arg}")
            self.db.update_run(run.id, **fields)
            return
        if run.not_before and now < run.not_before:
            return
        spec = RunSpec.model_validate(run.spec)
        idx = 0 if res is None else res.idx + 1
        cause = run.next_cause or ("submitted" if idx == 0 else "resumed")
        folder = Path(run.folder) / f"r{idx}"
        try:
            backend = self.backend(run.cluster)
            backend.check(spec)
            request = self._launch_request(run, spec, idx, folder, now)
        except PlatformError as exc:
            self._finish(run, FAILED, f"cannot start on {run.cluster}: {exc}", kind="config")
            return
        problem = too_few_nodes(backend, spec.compute.nodes, self.db.node_faults(run.cluster))
        if problem:
            self._finish(run, FAILED, f"cannot start on {run.cluster}: {problem}", kind="insufficient_nodes")
            return
        folder.mkdir(parents=True, exist_ok=True)
        # The intent first: if this process dies after sbatch succeeded but before the job id is stored,
        # the next supervisor finds the job by this row (`_reconcile`) instead of orphaning it.
        self.db.add_resumption(ResumptionRecord(run.id, idx, run.cluster, cause, SUBMITTING, str(folder), now))
        self._fault_point("after_intent")
        try:
            handle = backend.submit(request)
        except ClusterError as exc:
            try:
                found = backend.find(request)   # e.g. sbatch timed out after slurmctld had taken the job
            except ClusterError:
                return                          # the intent stays; the next pass asks the cluster again
            if found is None:
                self.db.delete_resumption(run.id, idx)
                self._submit_failed(run, spec, exc)
                return
            handle = found
        self._fault_point("after_submit")
        self.db.record_submission(run.id, idx, handle)
        excluded = f", excluding {', '.join(request.exclude)}" if request.exclude else ""
        self.db.add_event(run.id, "submitted", f"resumption {idx} submitted to {run.cluster} as job "
                          f"{handle.get('job_id')} ({cause}{excluded})")
        self.log(f"run {run.name}: resumption {idx} -> {run.cluster} job {handle.get('job_id')}")

    def _launch_request(self, run: RunRecord, spec: RunSpec, idx: int, folder: Path, now: float) -> LaunchRequest:
        injection = self.secrets.injection(spec.secrets)
        env = self._run_env(run, spec, idx, folder)
        time_limit = None
        if spec.scheduling.max_duration:
            time_limit = max(60.0, spec.scheduling.max_duration - self._run_time(run, now))
        return LaunchRequest(run.id, run.name, idx, folder, spec, env, dict(injection.env), injection.files,
                             exclude=self.db.excluded_nodes(run.cluster), time_limit=time_limit,
                             workdir=run.workdir)

    def _reconcile(self, run: RunRecord, res: ResumptionRecord) -> bool:
        """A SUBMITTING resumption: a supervisor died while submitting it. Adopt its job if the cluster
        has one (True), else forget the intent so it is submitted again (False). A cluster that cannot
        tell raises, and the next pass asks again: submitting twice would run two trainers at once."""
        spec = RunSpec.model_validate(run.spec)
        backend = self.backend(res.cluster)
        request = self._launch_request(run, spec, res.idx, Path(res.folder), time.time())
        handle = backend.find(request)
        if handle is None:
            self.db.delete_resumption(run.id, res.idx)
            self.db.add_event(run.id, "reconciled", f"resumption {res.idx} was being submitted to {res.cluster} "
                              "when the supervisor stopped, and no job was created: submitting it again")
            return False
        self.db.record_submission(run.id, res.idx, handle)
        self.db.add_event(run.id, "reconciled", f"resumption {res.idx} was being submitted to {res.cluster} "
                          f"when the supervisor stopped: found it as job {handle.get('job_id')} and adopted it")
        self.log(f"run {run.name}: adopted job {handle.get('job_id')} of resumption {res.idx}")
        return True

    def _fault_point(self, name: str) -> None:
        """Test-only fault injection (TESSERA_SUPERVISOR_FAULT=NAME): die here as a crash would."""
        if self.settings.fault == name:
            self.log(f"TESSERA_SUPERVISOR_FAULT={name}: exiting at once (fault injection)")
            os._exit(70)

    def _run_env(self, run: RunRecord, spec: RunSpec, idx: int, folder: Path) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        path = os.environ.get("PATH", "")
        env = {**spec.env, "RUN_NAME": run.name, "TESSERA_RUN_ID": run.id, "TESSERA_RESUMPTION": str(idx),
               "TESSERA_HEARTBEAT": str(folder / "heartbeat.json"),
               "TESSERA_PARAMETERS": str(Path(run.folder) / "parameters.yaml"),
               # the run finds `tessera` and `python` of the environment that submitted it
               "PATH": path if bin_dir in path.split(os.pathsep) else f"{bin_dir}{os.pathsep}{path}"}
        if spec.scheduling.hang_timeout:
            env["TESSERA_HEARTBEAT_INTERVAL"] = f"{min(30.0, spec.scheduling.hang_timeout / 4):g}"
        return env

    def _submit_failed(self, run: RunRecord, spec: RunSpec, exc: ClusterError) -> None:
        if run.retries_used >= spec.scheduling.max_retries:
            self._finish(run, FAILED, f"submission to {run.cluster} failed: {exc}", kind="submit")
            return
        delay = self._backoff(run.retries_used + 1)
        self.db.update_run(run.id, retries_used=run.retries_used + 1, not_before=time.time() + delay)
        self.db.add_event(run.id, "submit_failed", f"submission failed, retrying in {delay:g} s: {exc}")

    def _backoff(self, attempt: int) -> float:
        return min(300.0, self.settings.retry_backoff * 2 ** max(0, attempt - 1))

    # --- ending -----------------------------------------------------------------------------------

    def _ended(self, run: RunRecord, res: ResumptionRecord, spec: RunSpec, backend: ClusterBackend,
               handle: dict[str, Any], status: Any, now: float) -> None:
        backend.cleanup(handle)
        end = {"end": now, "exit_code": status.exit_code, "status": status.state.value}
        if res.start is None:
            end["start"] = status.start or now
        reason = res.stop_reason
        if reason in ("stop", "move", "restart"):
            outcome = {"stop": "stopped", "move": "moved", "restart": "restarted"}[reason]
            self.db.update_resumption(run.id, res.idx, outcome=outcome, **end)
            if reason == "stop":
                self._finish(run, STOPPED, None)
            elif reason == "move":
                target = run.request_arg or run.cluster
                self.db.update_run(run.id, status=PENDING, cluster=target, request=None, request_arg=None,
                                   next_cause=f"moved from {res.cluster} to {target}")
                self.db.add_event(run.id, "moved", f"stopped on {res.cluster}; resuming on {target}")
            else:
                self.db.update_run(run.id, status=PENDING, request=None, request_arg=None,
                                   next_cause="restarted on request")
            return
        if status.state is JobState.COMPLETED:
            self.db.update_resumption(run.id, res.idx, outcome="completed", **end)
            self._finish(run, COMPLETED, None)
            return
        redact = self.secrets.redactor()
        if reason == "max_duration":
            summary = f"exceeded max_duration {format_duration(spec.scheduling.max_duration)}"
            self.db.update_resumption(run.id, res.idx, outcome=FailureKind.TIMEOUT.value, detail=summary, **end)
            self._finish(run, FAILED, summary, kind=FailureKind.TIMEOUT.value)
            return
        failure = classify(self._evidence(run, res, spec, backend, status, now))
        self.db.update_resumption(run.id, res.idx, outcome=failure.kind.value, detail=redact(failure.summary),
                                  **end)
        self.db.add_event(run.id, "failure", redact(f"resumption {res.idx} failed: {failure.kind.value}: "
                                                    f"{failure.summary}"))
        self._mark_nodes(run, res, failure)
        self._decide(run, spec, failure, redact)

    def _evidence(self, run: RunRecord, res: ResumptionRecord, spec: RunSpec, backend: ClusterBackend,
                  status: Any, now: float) -> Evidence:
        folder = Path(res.folder)
        logs = {r: _tail(backend.log_path(folder, r)) for r in range(spec.compute.nodes)}
        seen = self.unhealthy.get(res.cluster, {})
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
            made_progress = now - (res.start or now) > self.settings.early_window
        return Evidence(status.state, status.exit_code, status.node_exits, logs, list(by_rank),
                        sorted(unhealthy & set(nodes)) if nodes else sorted(unhealthy), made_progress,
                        hang=res.stop_reason == "hang")

    def _mark_nodes(self, run: RunRecord, res: ResumptionRecord, failure: Failure) -> None:
        if self.backend(res.cluster).type == "local":
            return   # one node: excluding it would leave nowhere to run
        for node in failure.nodes:
            faults, excluded = self.db.record_node_fault(res.cluster, node, f"{failure.kind.value} in run "
                                                         f"{run.name}", hard=failure.hard)
            if excluded:
                self.db.add_event(run.id, "node_excluded", f"node {node} of {res.cluster} excluded from later "
                                  f"submissions ({faults} fault(s), last: {failure.kind.value})")

    def _decide(self, run: RunRecord, spec: RunSpec, failure: Failure, redact: Redactor) -> None:
        sched = spec.scheduling
        kind, summary = failure.kind.value, redact(failure.summary)
        first_error = redact(failure.first_error) if failure.first_error else None
        if failure.action is Action.FAIL:
            self._finish(run, FAILED, summary, kind=kind, first_error=first_error)
            return
        fields: dict[str, Any] = {}
        if failure.system and sched.retry_on_system_failure and run.system_retries < MAX_SYSTEM_RETRIES:
            fields["system_retries"] = run.system_retries + 1
            delay = 0.0
        elif run.retries_used < sched.max_retries:
            fields["retries_used"] = run.retries_used + 1
            delay = self._backoff(run.retries_used + 1)
        else:
            used = run.retries_used
            self._finish(run, FAILED, f"gave up after {used} retr{'y' if used == 1 else 'ies'}: {summary}",
                         kind=kind, first_error=first_error)
            return
        self.db.update_run(run.id, status=PENDING, next_cause=f"retry after {kind}: {summary}",
                           not_before=time.time() + delay, **fields)
        self.db.add_event(run.id, "retry", f"retrying ({kind})" + (f" in {delay:g} s" if delay else ""))

    def _finish(self, run: RunRecord, status: str, message: str | None, kind: str | None = None,
                first_error: str | None = None) -> None:
        fields: dict[str, Any] = {"status": status, "ended": time.time(), "request": None, "request_arg": None,
                                  "not_before": None}
        if status == FAILED:
            fields.update(failure_kind=kind, first_error=first_error or message)
        self.db.update_run(run.id, **fields)
        self.db.add_event(run.id, status.lower(), message or status.lower())
        self.log(f"run {run.name}: {status}" + (f" ({message})" if message else ""))


# --- starting the supervisor ----------------------------------------------------------------------


def _try_lock(home: Path) -> int | None:
    fd = os.open(home / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def supervisor_running(home: str | Path | None = None) -> bool:
    fd = _try_lock(tessera_home(home))
    if fd is None:
        return True
    os.close(fd)
    return False


def ensure_supervisor(home: str | Path | None = None, env: dict[str, str] | None = None) -> bool:
    """Start a detached supervisor for `home` unless one is running; True if one was started."""
    home = tessera_home(home)
    if supervisor_running(home):
        return False
    log = open(home / "supervisor.log", "ab")
    try:
        # -c rather than -m: the package __init__ already imports this module (runpy would warn)
        subprocess.Popen([sys.executable, "-c", "import sys; from tessera.platform.supervisor import main; "
                          "sys.exit(main(sys.argv[1:]))", "--home", str(home)],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                         close_fds=True, env={**os.environ, **(env or {})})
    finally:
        log.close()
    return True


def stop_supervisor(home: str | Path | None = None, timeout: float = 10.0) -> bool:
    """SIGTERM the supervisor of `home` (runs keep going) and wait for it; True if one was stopped."""
    home = tessera_home(home)
    if not supervisor_running(home):
        return False   # a pid file left by a supervisor that was killed may name another process now
    try:
        pid = int((home / "supervisor.pid").read_text())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and supervisor_running(home):
        time.sleep(0.05)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.platform.supervisor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", default=None, help="TESSERA_HOME (default: $TESSERA_HOME or ~/.tessera)")
    args = parser.parse_args(argv)
    return Supervisor(args.home).run_forever()


if __name__ == "__main__":
    sys.exit(main())
