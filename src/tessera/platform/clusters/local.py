"""The local cluster: this machine, one node. Each resumption is a launcher process (launch.py) in a
session of its own, so it survives the CLI and the supervisor; the launcher writes node-0.exit when the
command ends, which is how a restarted supervisor learns the exit status of a process it did not start.
Several ranks per node go through torchrun (`procs_per_node` or `gpus_per_node` > 1).

A run's `image` is used through podman or docker when this host has one that works (containers.py);
without one the command runs on the host and the node's log says so, unless the cluster's config has
`require_image: true`, which refuses such a run before it is created.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tessera.platform.clusters.base import (
    ClusterBackend,
    JobState,
    JobStatus,
    LaunchRequest,
    NodeInfo,
    hostname,
    local_gpus,
    no_runtime_note,
    read_node_exits,
    read_node_starts,
    write_launch_files,
)
from tessera.platform.clusters.containers import CONTAINER_PYTHON, container_name, local_runtime, runtime_argv
from tessera.platform.clusters.environment import inherited_environment
from tessera.platform.errors import ClusterError
from tessera.platform.spec.run_spec import RunSpec

_children: dict[int, subprocess.Popen[bytes]] = {}   # reaped on status(), so no zombies pile up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, ticks: int | None) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and (ticks is None or int(fields[19]) == ticks)


class LocalBackend(ClusterBackend):
    type = "local"

    def check(self, spec: RunSpec) -> None:
        if spec.image and self.config.get("require_image") and not local_runtime(self.config):
            raise ClusterError(f"the run asks for image {spec.image} and cluster {self.name!r} requires images "
                               "(require_image), but this host has no working container runtime (podman or docker)")
        if spec.compute.nodes != 1:
            raise ClusterError(f"cluster {self.name!r} is this machine (one node); the run asks for "
                               f"{spec.compute.nodes} nodes: use a Slurm cluster, or nodes: 1")
        cpus = spec.compute.cpus_per_node
        if cpus and cpus > (os.cpu_count() or 1):
            raise ClusterError(f"the run asks for {cpus} CPUs per node; this machine has {os.cpu_count()}")

    def submit(self, request: LaunchRequest) -> dict[str, Any]:
        self.check(request.spec)
        image = request.spec.image
        runtime = local_runtime(self.config) if image else None
        python = CONTAINER_PYTHON if runtime else sys.executable
        notes = [no_runtime_note(str(image))] if image and not runtime else []
        write_launch_files(request, [python, "-m", "torch.distributed.run"], grace=request.spec.scheduling.stop_grace,
                           secrets_in_file=False, notes=notes)
        given = {**request.env, **request.secret_env, **{var: str(path) for path, _, var in request.secret_files},
                 "NODE_RANK": "0", "NNODES": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        env = {**inherited_environment(), **given}
        for key in [k for k in env if k.startswith("SLURM_")]:
            del env[key]     # a local run started from inside a Slurm job must not look like one
        argv = [sys.executable, str(request.folder / "launch.py")]
        if runtime:
            argv = runtime_argv(runtime, request, [k for k in given if k != "PATH"], python)
        log = open(request.folder / "node-0.log", "ab")
        try:
            proc = subprocess.Popen(argv, env=env,
                                    cwd=request.workdir or None, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_nice(request.spec.scheduling.priority))
        finally:
            log.close()
        _children[proc.pid] = proc
        handle = {"job_id": str(proc.pid), "pid": proc.pid, "ticks": _start_ticks(proc.pid),
                  "folder": str(request.folder), "nodes": [hostname()], "submitted": time.time()}
        if runtime:
            handle["container"] = [runtime, container_name(request)]
        return handle

    def find(self, request: LaunchRequest) -> dict[str, Any] | None:
        """The launcher of `request.folder`: a live process running `python <folder>/launch.py`, or the
        node-0.start file a launcher that has already ended left behind."""
        launcher = str(request.folder / "launch.py")
        handle = {"job_id": "", "folder": str(request.folder), "nodes": [hostname()], "submitted": time.time()}
        running = _processes_running(launcher)
        if running:
            pid = running[0]
            return {**handle, "job_id": str(pid), "pid": pid, "ticks": _start_ticks(pid)}
        start = read_node_starts(request.folder).get(0)
        if start is None:
            return None
        pid = int(start["launcher_pid"])
        # ticks 0 matches no live process: that launcher has ended (its exit file, if any, tells how)
        return {**handle, "job_id": str(pid), "pid": pid, "ticks": 0, "submitted": float(start["time"])}

    def status(self, handle: dict[str, Any]) -> JobStatus:
        for pid, proc in list(_children.items()):
            if proc.poll() is not None:
                del _children[pid]
        folder, pid = Path(handle["folder"]), int(handle["pid"])
        exits = read_node_exits(folder)
        nodes = handle.get("nodes", [hostname()])
        if exits:
            code = max((e.exit_code for e in exits), key=lambda c: c != 0)
            return JobStatus(JobState.COMPLETED if code == 0 else JobState.FAILED, code, nodes,
                             node_exits=exits, start=handle.get("submitted"))
        if _alive(pid, handle.get("ticks")):
            return JobStatus(JobState.RUNNING, nodes=nodes, start=handle.get("submitted"))
        # The launcher is gone without an exit file (it was killed itself): end what it left behind.
        self.kill(handle)
        cancelled = bool(handle.get("cancelled"))
        return JobStatus(JobState.CANCELLED if cancelled else JobState.LOST, None, nodes,
                         reason="the launcher process ended without recording an exit status")

    def terminate(self, handle: dict[str, Any]) -> None:
        """SIGTERM to the launcher, which relays it to the command's processes once and waits for them."""
        pid = int(handle["pid"])
        if _alive(pid, handle.get("ticks")):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill(self, handle: dict[str, Any]) -> None:
        try:
            os.killpg(int(handle["pid"]), signal.SIGKILL)   # the launcher leads its own process group
        except (ProcessLookupError, PermissionError):
            pass
        if handle.get("container"):   # docker's container outlives its killed client
            runtime, name = handle["container"]
            subprocess.run([runtime, "rm", "-f", name], capture_output=True, timeout=60, check=False)

    def nodes(self) -> list[NodeInfo]:
        gpus, model = local_gpus()
        return [NodeInfo(hostname(), "up", True, cpus=os.cpu_count(), gpus=gpus, gpu_type=model)]


def _processes_running(script: str) -> list[int]:
    """Pids of live processes whose command line is `<python> <script>` (a launcher of one folder)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if len(args) >= 2 and args[1].decode(errors="replace") == script and _alive(int(entry), None):
            out.append(int(entry))
    return out


def _nice(priority: str):
    if priority != "low":
        return None
    return lambda: os.nice(10)
