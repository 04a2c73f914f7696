"""GPU health as the MosaicML platform watches it: a pre-flight on every node before the command
(clusters/gpu_preflight.py, run by the launcher as a prelude step), and the GPU faults found in what the
processes and the kernel wrote to a node's log after a resumption failed. failures.classify turns both into
a `Failure`; this module only reads the evidence.

Who is to blame for a GPU error decides what happens to the node (docs/gpu-health.md):

| blame     | evidence                                                             | node              |
|-----------|----------------------------------------------------------------------|-------------------|
| node      | pre-flight fault; Xid 48/61/62/63/64/74/79/92/94/95/119/120/140;     | excluded at once  |
|           | "uncorrectable ECC error encountered"; "GPU has fallen off the bus"  |                   |
| suspect   | NCCL watchdog timeout; an Xid of no known kind; an illegal memory    | excluded after two|
|           | access after the run made progress                                   | such faults       |
| program   | Xid 13/31/43/45 (engine exception, MMU fault, stopped or cleaned-up  | not blamed        |
|           | channel): the program's own doing, as NVIDIA's Xid catalog says       |                   |
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from tessera.platform.clusters.gpu_preflight import FAULT_EXIT, HARDWARE_XIDS, XID_LINE
from tessera.platform.spec.run_spec import RunSpec

PREFLIGHT_SCRIPT = Path(__file__).resolve().parent.parent / "clusters" / "gpu_preflight.py"
PREFLIGHT_FAULT_EXIT = FAULT_EXIT
PROGRAM_XIDS = {13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
                45: "preemptive cleanup after an earlier error"}


class Blame(StrEnum):
    NODE = "node"          # the hardware: exclude the node before the restart
    SUSPECT = "suspect"    # hardware or program: count a fault against the node
    PROGRAM = "program"    # the program's own doing: the node is not blamed


@dataclass(frozen=True)
class GpuFault:
    kind: str        # e.g. "xid_79", "ecc_uncorrectable", "nccl_timeout", "preflight"
    blame: Blame
    what: str        # what it means, in a few words
    line: str        # the log line (or pre-flight reason) it was found in

    def describe(self) -> str:
        return f"{self.kind} ({self.what}): {self.line[:300]}"


# Texts the processes print (CUDA runtime, PyTorch's NCCL watchdog, the driver through the program).
_TEXTS: list[tuple[re.Pattern[str], str, Blame, str]] = [
    (re.compile(r"tessera gpu-preflight: node \S+ FAULT: "), "preflight", Blame.NODE, "GPU pre-flight failed"),
    (re.compile(r"GPU has fallen off the bus|Unable to determine the device handle for GPU", re.I), "gpu_lost",
     Blame.NODE, "GPU has fallen off the bus"),
    (re.compile(r"uncorrectable ECC error encountered", re.I), "ecc_uncorrectable", Blame.NODE,
     "uncorrectable ECC error"),
    (re.compile(r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imeout"), "nccl_timeout",
     Blame.SUSPECT, "NCCL collective timed out"),
    (re.compile(r"an illegal memory access was encountered", re.I), "illegal_memory_access", Blame.SUSPECT,
     "CUDA illegal memory access"),
]


def scan(text: str) -> list[GpuFault]:
    """Every GPU fault in `text` (one node's log), in the order they appear."""
    found = []
    for line in text.splitlines():
        xid = XID_LINE.search(line)
        if xid:
            code = int(xid.group("code"))
            if code in HARDWARE_XIDS:
                found.append(GpuFault(f"xid_{code}", Blame.NODE, HARDWARE_XIDS[code], line.strip()))
            elif code in PROGRAM_XIDS:
                found.append(GpuFault(f"xid_{code}", Blame.PROGRAM, PROGRAM_XIDS[code], line.strip()))
            else:
                found.append(GpuFault(f"xid_{code}", Blame.SUSPECT, "Xid of no known kind", line.strip()))
            continue
        for pattern, kind, blame, what in _TEXTS:
            if pattern.search(line):
                found.append(GpuFault(kind, blame, what, line.strip()))
                break
    return found


def read_preflight(folder: Path) -> dict[int, dict[str, Any]]:
    """node rank -> the node-R.preflight.json that node's pre-flight wrote in the resumption folder."""
    out: dict[int, dict[str, Any]] = {}
    for path in folder.glob("node-*.preflight.json"):
        try:
            body = json.loads(path.read_text())
            out[int(body["rank"])] = body
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def preflight_faults(preflight: dict[int, dict[str, Any]]) -> dict[int, GpuFault]:
    """node rank -> the fault of each node whose pre-flight found one."""
    return {rank: GpuFault("preflight", Blame.NODE, "GPU pre-flight failed", str(body.get("reason") or "fault"))
            for rank, body in sorted(preflight.items()) if body.get("verdict") == "fault"}


def preflight_argv(spec: RunSpec) -> list[str]:
    """The pre-flight's arguments for `spec` (after `python gpu_preflight.py`)."""
    argv = ["--gpus", str(spec.compute.gpus_per_node)]
    if spec.compute.gpu_type:
        argv += ["--gpu-type", spec.compute.gpu_type]
    return argv


def preflight_step(spec: RunSpec) -> dict[str, Any] | None:
    """The prelude step that runs the pre-flight on each node before the command, or None when the run
    asks for no GPUs. The launcher runs `argv` in the resumption folder (where `files` are copied) with
    the node's python in place of "{python}"; a step exiting `fault_exit` is a node fault, not the run's."""
    if spec.compute.gpus_per_node <= 0:
        return None
    return {"name": "gpu-preflight", "argv": ["{python}", PREFLIGHT_SCRIPT.name, *preflight_argv(spec)],
            "env": {}, "files": {PREFLIGHT_SCRIPT.name: str(PREFLIGHT_SCRIPT)}, "fault_exit": PREFLIGHT_FAULT_EXIT}


def hardware_fault(logs: dict[int, str]) -> tuple[int, GpuFault] | None:
    """The first GPU hardware fault (blame NODE) in the nodes' logs, with its node rank: seen while a
    run is still going, it ends the resumption at once, rather than when NCCL's watchdog gives up on the
    node's peers (10 minutes by default) or never, if the run sets no hang_timeout."""
    for rank, text in sorted(logs.items()):
        fault = next((f for f in scan(text) if f.blame is Blame.NODE), None)
        if fault:
            return rank, fault
    return None


def postmortem_step(spec: RunSpec) -> dict[str, Any] | None:
    """The step to run on each node after a command that failed: it prints the Xid lines the kernel
    logged since the pre-flight into the node's log, where classification finds them."""
    if spec.compute.gpus_per_node <= 0:
        return None
    return {"name": "gpu-postmortem", "argv": ["{python}", PREFLIGHT_SCRIPT.name, "--after"], "env": {},
            "files": {PREFLIGHT_SCRIPT.name: str(PREFLIGHT_SCRIPT)}}
