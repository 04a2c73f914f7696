"""Failure classification: from how a resumption ended (scheduler state, exit codes and signals, log
signatures, heartbeat progress) to a `Failure` whose kind decides what the supervisor does.

| kind        | evidence                                                        | action               |
|-------------|-----------------------------------------------------------------|----------------------|
| hang        | no new heartbeat for hang_timeout while the processes lived     | retry                |
| node_fault  | scheduler NODE_FAIL, a failed GPU pre-flight, a GPU fault or an  | exclude node, retry  |
|             | NCCL signature in a node's log (gpu_health.py)                  |                      |
| preemption  | scheduler PREEMPTED or TIMEOUT, or SIGTERM we did not send      | retry                |
| oom         | scheduler OUT_OF_MEMORY, or out-of-memory signatures            | retry                |
| storage     | storage/IO signatures (no space, I/O error, S3 5xx, ...)         | retry                |
| crash       | killed by a signal (SIGKILL, SIGSEGV, ...) with no other sign    | retry                |
| user_error  | non-zero exit with no progress in this resumption (e.g. a       | fail at once         |
|             | traceback at step 0, command not found)                         |                      |
| error       | non-zero exit after progress, no other sign                     | retry                |

node_fault and preemption are "system" failures: with retry_on_system_failure they are retried without
counting against max_retries. A node named by a hard signal (scheduler NODE_FAIL, a failed GPU pre-flight, a
GPU hardware fault: Xid 79, 48, 94, ..., an uncorrectable ECC error) is excluded at once; one implicated by
softer evidence (a crash, an NCCL timeout, an unknown Xid, an illegal memory access after progress) after
two such failures. An Xid of the program's own kind (13, 31, 43) blames no node.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from enum import StrEnum

from tessera.platform.clusters.base import JobState, NodeExit
from tessera.platform.supervision.gpu_health import Blame, GpuFault, preflight_faults, scan


class FailureKind(StrEnum):
    USER_ERROR = "user_error"
    OOM = "oom"
    NODE_FAULT = "node_fault"
    HANG = "hang"
    PREEMPTION = "preemption"
    STORAGE = "storage"
    CRASH = "crash"
    ERROR = "error"
    TIMEOUT = "max_duration"    # the run's own max_duration: ends the run, not retried


class Action(StrEnum):
    RETRY = "retry"
    EXCLUDE_AND_RETRY = "exclude_and_retry"
    FAIL = "fail"


SYSTEM_KINDS = {FailureKind.NODE_FAULT, FailureKind.PREEMPTION}

OOM_SIGNATURES = re.compile(
    r"CUDA out of memory|OutOfMemoryError|out of memory|oom[-_]kill|Killed process \d+|\bMemoryError\b|"
    r"Cannot allocate memory|std::bad_alloc", re.IGNORECASE)
STORAGE_SIGNATURES = re.compile(
    r"StorageError|No space left on device|Input/output error|Read-only file system|Stale file handle|"
    r"Disk quota exceeded|Transport endpoint is not connected|SlowDown|ServiceUnavailable|"
    r"InternalError.*(?:S3|bucket)|RequestTimeout|Connection reset by peer|EndpointConnectionError")
# GPU faults (Xids, ECC, a GPU off the bus, NCCL timeouts) are gpu_health.scan's; these are the rest.
NODE_SIGNATURES = re.compile(
    r"NCCL error|ncclSystemError|ncclUnhandledCudaError|ncclInternalError|GPU is lost|"
    r"CUDA error: unspecified launch failure|DUE TO NODE FAILURE|Node failure on")
_TRACEBACK = "Traceback (most recent call last):"
_CLI_ERROR = "error: "  # tessera.cli.console.fail
_PREFIX = re.compile(r"^\[default\d+\]:")
_CRASH_SIGNALS = {signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}


@dataclass
class Evidence:
    """What the supervisor knows when a resumption ends."""
    state: JobState
    exit_code: int | None = None
    node_exits: list[NodeExit] = field(default_factory=list)
    logs: dict[int, str] = field(default_factory=dict)            # node rank -> tail of its log
    nodes: list[str] = field(default_factory=list)                # nodes of the job, by node rank
    unhealthy_nodes: list[str] = field(default_factory=list)      # seen unhealthy while it ran
    made_progress: bool = False
    hang: bool = False
    preflight: dict[int, dict] = field(default_factory=dict)      # node rank -> node-R.preflight.json


@dataclass
class Failure:
    kind: FailureKind
    action: Action
    summary: str
    first_error: str | None = None
    nodes: list[str] = field(default_factory=list)   # implicated nodes
    hard: bool = False                               # the scheduler, or the GPUs themselves, named the nodes
    gpu_fault: str | None = None                     # e.g. "xid_79", "preflight" (gpu_health.GpuFault.kind)

    @property
    def system(self) -> bool:
        return self.kind in SYSTEM_KINDS


def first_exception(text: str) -> str | None:
    """The exception line that ends the first Python traceback in `text` (e.g. "ValueError: bad lr"), else
    the first one-line error the `tessera` CLI prints instead of a traceback ("error: no index.json")."""
    lines = [_PREFIX.sub("", line) for line in text.splitlines()]
    for i, line in enumerate(lines):
        if line.strip() != _TRACEBACK:
            continue
        for follow in lines[i + 1:]:
            if follow.strip() and not follow.startswith((" ", "\t")) and follow.strip() != _TRACEBACK:
                return follow.strip()[:500]
    return next((line.strip()[:500] for line in lines if line.startswith(_CLI_ERROR)), None)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code > 128 and code - 128 < 65:
        return f"exit {code} ({_signal_name(code - 128)})"
    return f"exit {code}"


def _primary(exits: list[NodeExit]) -> NodeExit | None:
    """The node whose exit explains the failure: a plain non-zero exit beats a kill, which srun
    --kill-on-bad-exit and torchrun inflict on the others."""
    failed = [e for e in exits if e.exit_code != 0]
    for wanted in (lambda e: e.exit_code < 128, lambda e: e.exit_code not in (137, 143), lambda e: True):
        for e in failed:
            if wanted(e):
                return e
    return None


def classify(ev: Evidence) -> Failure:
    """Decide what kind of failure ended a resumption (see the module's table)."""
    all_logs = "\n".join(ev.logs[r] for r in sorted(ev.logs))
    first_error = first_exception(all_logs)
    primary = _primary(ev.node_exits)
    code = primary.exit_code if primary else ev.exit_code
    where = f" on node {primary.rank} ({primary.node})" if primary and primary.node else ""
    primary_nodes = [primary.node] if primary and primary.node else []

    if ev.hang:
        return Failure(FailureKind.HANG, Action.RETRY, "no heartbeat progress within hang_timeout; killed",
                       first_error)
    preflight = _preflight_failure(ev, first_error)
    if preflight:
        return preflight
    if ev.state is JobState.NODE_FAIL:
        bad = [n for n in ev.nodes if n in ev.unhealthy_nodes] or list(ev.unhealthy_nodes)
        named = f": {', '.join(bad)}" if bad else ""
        return Failure(FailureKind.NODE_FAULT, Action.EXCLUDE_AND_RETRY if bad else Action.RETRY,
                       f"the scheduler reported a node failure{named}", first_error, bad, hard=True)
    if ev.state is JobState.PREEMPTED:
        return Failure(FailureKind.PREEMPTION, Action.RETRY, "preempted by the scheduler", first_error)
    if ev.state is JobState.TIMEOUT:
        return Failure(FailureKind.PREEMPTION, Action.RETRY, "the scheduler's time limit was reached",
                       first_error)
    gpu = {r: scan(text) for r, text in sorted(ev.logs.items())} if code not in (0, None) else {}
    first_error = first_error or next((f.line[:500] for faults in gpu.values() for f in faults), None)
    hardware = _gpu_failure(ev, gpu, Blame.NODE, first_error)
    if hardware:
        return hardware
    if ev.state is JobState.OUT_OF_MEMORY or (code not in (0, None) and OOM_SIGNATURES.search(all_logs)):
        return Failure(FailureKind.OOM, Action.RETRY, f"out of memory ({_describe_exit(code)}{where})",
                       first_error, primary_nodes)
    if code not in (0, None) and STORAGE_SIGNATURES.search(all_logs):
        match = STORAGE_SIGNATURES.search(all_logs)
        return Failure(FailureKind.STORAGE, Action.RETRY,
                       f"storage error ({match.group(0)}; {_describe_exit(code)}{where})", first_error)
    suspect = _suspect_failure(ev, gpu, first_error)
    if suspect:
        return suspect
    node_hits = [r for r, text in sorted(ev.logs.items()) if NODE_SIGNATURES.search(text)]
    if node_hits and code not in (0, None):
        nodes = [ev.nodes[r] for r in node_hits if r < len(ev.nodes)]
        return Failure(FailureKind.NODE_FAULT, Action.EXCLUDE_AND_RETRY if nodes else Action.RETRY,
                       f"hardware or interconnect fault in the log of node(s) {', '.join(map(str, node_hits))}",
                       first_error, nodes)
    if ev.state is JobState.LOST:
        return Failure(FailureKind.CRASH, Action.RETRY, "the job vanished without an exit status", first_error)
    if ev.state is JobState.CANCELLED:
        return Failure(FailureKind.PREEMPTION, Action.RETRY, "cancelled outside Tessera", first_error)
    if code is not None and code > 128:
        sig = code - 128
        if sig == signal.SIGTERM or sig == signal.SIGINT:
            return Failure(FailureKind.PREEMPTION, Action.RETRY,
                           f"stopped by {_signal_name(sig)} that Tessera did not send{where}", first_error)
        if sig in _CRASH_SIGNALS:
            return Failure(FailureKind.CRASH, Action.RETRY, f"killed: {_describe_exit(code)}{where}",
                           first_error, primary_nodes)
    if code in (126, 127):
        return Failure(FailureKind.USER_ERROR, Action.FAIL,
                       f"command not found or not executable ({_describe_exit(code)}{where})", first_error)
    if not ev.made_progress:
        detail = f"; {first_error}" if first_error else ""
        return Failure(FailureKind.USER_ERROR, Action.FAIL,
                       f"the command failed before making progress ({_describe_exit(code)}{where}){detail}",
                       first_error)
    return Failure(FailureKind.ERROR, Action.RETRY, f"the command failed after progress "
                   f"({_describe_exit(code)}{where})", first_error)


# --- GPU faults (gpu_health.py finds them; this decides what they mean for the run and its nodes) -------


def _node(ev: Evidence, rank: int) -> str | None:
    return ev.nodes[rank] if rank < len(ev.nodes) else None


def _preflight_failure(ev: Evidence, first_error: str | None) -> Failure | None:
    """A node failed its GPU pre-flight: the command never started there, so nothing else matters."""
    faults = preflight_faults(ev.preflight)
    if not faults:
        return None
    nodes = [str(ev.preflight[r].get("node") or _node(ev, r) or "") for r in faults]
    nodes = [n for n in nodes if n]
    rank, fault = next(iter(faults.items()))
    return Failure(FailureKind.NODE_FAULT, Action.EXCLUDE_AND_RETRY if nodes else Action.RETRY,
                   f"GPU pre-flight failed on node {rank} ({nodes[0] if nodes else '?'}): {fault.line}",
                   first_error or fault.line, nodes, hard=True, gpu_fault=fault.kind)


def _gpu_failure(ev: Evidence, gpu: dict[int, list[GpuFault]], blame: Blame,
                 first_error: str | None) -> Failure | None:
    """The GPU hardware faults (`blame` NODE) in the nodes' logs: those nodes are excluded at once."""
    hits = {r: next(f for f in faults if f.blame is blame) for r, faults in gpu.items()
            if any(f.blame is blame for f in faults)}
    if not hits:
        return None
    nodes = [n for n in (_node(ev, r) for r in hits) if n]
    rank, fault = next(iter(hits.items()))
    return Failure(FailureKind.NODE_FAULT, Action.EXCLUDE_AND_RETRY if nodes else Action.RETRY,
                   f"GPU fault in the log of node {rank} ({_node(ev, rank) or '?'}): {fault.describe()}",
                   first_error or fault.line, nodes, hard=True, gpu_fault=fault.kind)


def _suspect_failure(ev: Evidence, gpu: dict[int, list[GpuFault]], first_error: str | None) -> Failure | None:
    """GPU errors that may be the program's or the hardware's: the node gets a soft fault (excluded at the
    second). An illegal memory access before any progress, or beside an Xid of the program's kind, is the
    program's (user_error, by the rules that follow)."""
    kinds = {r: {f.kind: f for f in faults} for r, faults in gpu.items() if faults}
    program = {r for r, faults in gpu.items() if any(f.blame is Blame.PROGRAM for f in faults)}
    illegal = {r: k["illegal_memory_access"] for r, k in kinds.items() if "illegal_memory_access" in k}
    if illegal:
        if not ev.made_progress or program & set(illegal):
            return None
        rank, fault = next(iter(illegal.items()))
        nodes = [n for n in (_node(ev, r) for r in illegal) if n]
        return Failure(FailureKind.ERROR, Action.RETRY, f"CUDA illegal memory access after progress on node "
                       f"{rank} ({_node(ev, rank) or '?'}): a program bug or a GPU fault; counted retry, and the "
                       "node is excluded if it happens there again", first_error or fault.line, nodes,
                       gpu_fault=fault.kind)
    unknown = {r: f for r, faults in gpu.items() for f in faults if f.blame is Blame.SUSPECT
               and f.kind.startswith("xid_")}
    if unknown:
        rank, fault = next(iter(unknown.items()))
        nodes = [n for n in (_node(ev, r) for r in unknown) if n]
        return Failure(FailureKind.NODE_FAULT, Action.EXCLUDE_AND_RETRY if nodes else Action.RETRY,
                       f"GPU error in the log of node {rank}: {fault.describe()}", first_error or fault.line,
                       nodes, gpu_fault=fault.kind)
    timeouts = {r: k["nccl_timeout"] for r, k in kinds.items() if "nccl_timeout" in k}
    if not timeouts:
        return None
    # The ranks that time out are the ones left waiting: the node that did not report one is the suspect.
    silent = [n for r, n in enumerate(ev.nodes) if r not in timeouts] if len(timeouts) < len(ev.nodes) else []
    rank, fault = next(iter(timeouts.items()))
    named = f"; suspect: {', '.join(silent)} (no timeout of its own)" if silent else ""
    return Failure(FailureKind.NODE_FAULT, Action.EXCLUDE_AND_RETRY if silent else Action.RETRY,
                   f"NCCL collective timed out on node(s) {', '.join(map(str, timeouts))}{named}",
                   first_error or fault.line, silent, gpu_fault=fault.kind)
