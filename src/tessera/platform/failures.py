"""Failure classification: from how a resumption ended (scheduler state, exit codes and signals, log
signatures, heartbeat progress) to a `Failure` whose kind decides what the supervisor does.

| kind        | evidence                                                        | action               |
|-------------|-----------------------------------------------------------------|----------------------|
| hang        | no new heartbeat for hang_timeout while the processes lived     | retry                |
| node_fault  | scheduler NODE_FAIL, or hardware/NCCL signatures in a node's log| exclude node, retry  |
| preemption  | scheduler PREEMPTED or TIMEOUT, or SIGTERM we did not send      | retry                |
| oom         | scheduler OUT_OF_MEMORY, or out-of-memory signatures            | retry                |
| storage     | storage/IO signatures (no space, I/O error, S3 5xx, ...)         | retry                |
| crash       | killed by a signal (SIGKILL, SIGSEGV, ...) with no other sign    | retry                |
| user_error  | non-zero exit with no progress in this resumption (e.g. a       | fail at once         |
|             | traceback at step 0, command not found)                         |                      |
| error       | non-zero exit after progress, no other sign                     | retry                |

node_fault and preemption are "system" failures: with retry_on_system_failure they are retried without
counting against max_retries. A node named by a hard signal (scheduler NODE_FAIL) is excluded at once;
one implicated by softer evidence (a crash or hardware signature on it) after two such failures.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from enum import StrEnum

from tessera.platform.clusters.base import JobState, NodeExit


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
NODE_SIGNATURES = re.compile(
    r"NCCL error|ncclSystemError|ncclUnhandledCudaError|ncclInternalError|uncorrectable ECC|ECC error|"
    r"\bXid\b|GPU is lost|fallen off the bus|CUDA error: unspecified launch failure|"
    r"DUE TO NODE FAILURE|Node failure on")
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


@dataclass
class Failure:
    kind: FailureKind
    action: Action
    summary: str
    first_error: str | None = None
    nodes: list[str] = field(default_factory=list)   # implicated nodes
    hard: bool = False                               # the scheduler itself named the nodes

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
    if ev.state is JobState.OUT_OF_MEMORY or (code not in (0, None) and OOM_SIGNATURES.search(all_logs)):
        return Failure(FailureKind.OOM, Action.RETRY, f"out of memory ({_describe_exit(code)}{where})",
                       first_error, primary_nodes)
    if code not in (0, None) and STORAGE_SIGNATURES.search(all_logs):
        match = STORAGE_SIGNATURES.search(all_logs)
        return Failure(FailureKind.STORAGE, Action.RETRY,
                       f"storage error ({match.group(0)}; {_describe_exit(code)}{where})", first_error)
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
