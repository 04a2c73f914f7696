"""The interface every cluster backend implements, and the launch files the local and Slurm backends
share.

A backend submits one resumption of a run as a gang (every node starts, or none), reports its status,
signals it (terminate = SIGTERM for a graceful stop, kill = SIGKILL), lists its nodes and their health,
and leaves per-node logs in the resumption folder as `node-R.log` (R = node rank; with several ranks per
node, torchrun prefixes each line with `[defaultL]:`, L = local rank).
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from tessera.platform.home import write_private
from tessera.platform.spec.run_spec import RunSpec

LAUNCHER = Path(__file__).with_name("launch.py")


class JobState(StrEnum):
    QUEUED = "QUEUED"                # accepted, waiting for nodes
    RUNNING = "RUNNING"              # processes are up (or finishing)
    COMPLETED = "COMPLETED"          # every node exited 0
    FAILED = "FAILED"                # some node exited non-zero
    CANCELLED = "CANCELLED"          # cancelled (by us, or by an admin)
    TIMEOUT = "TIMEOUT"              # the scheduler's time limit
    NODE_FAIL = "NODE_FAIL"          # the scheduler saw a node fail
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"  # the scheduler's memory limit
    LOST = "LOST"                    # gone without a trace of how it ended

    @property
    def done(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)


@dataclass
class NodeExit:
    rank: int
    node: str
    exit_code: int
    signal: int | None = None
    reason: str = ""     # set when the node ended before its command (a failed prelude step, a stop)


@dataclass
class JobStatus:
    state: JobState
    exit_code: int | None = None
    nodes: list[str] = field(default_factory=list)
    reason: str = ""
    node_exits: list[NodeExit] = field(default_factory=list)
    start: float | None = None


@dataclass
class NodeInfo:
    name: str
    state: str
    healthy: bool
    reason: str = ""
    cpus: int | None = None
    gpus: int = 0
    gpu_type: str | None = None


def parse_gres(gres: str) -> tuple[int, str | None]:
    """(GPU count, GPU type) of a Slurm node's Gres string: "gpu:a100:8(S:0-1),nic:1" -> (8, "a100"),
    "gpu:2" -> (2, None), "" -> (0, None)."""
    count, kind = 0, None
    for item in filter(None, (part.strip() for part in gres.split(","))):
        fields = item.split("(")[0].split(":")
        if fields[0] != "gpu" or len(fields) < 2:
            continue
        try:
            count += int(fields[-1])
        except ValueError:
            continue
        if len(fields) > 2:
            kind = kind or fields[1]
    return count, kind


def local_gpus() -> tuple[int, str | None]:
    """(count, model) of this machine's NVIDIA GPUs from `nvidia-smi`; (0, None) without a driver."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0, None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
    return len(names), (names[0] if names else None)


@dataclass
class LaunchRequest:
    """One resumption to start. `env` holds no secret; `secret_env` and `secret_files` do."""
    run_id: str
    run_name: str
    resumption: int
    folder: Path
    spec: RunSpec
    env: dict[str, str]
    secret_env: dict[str, str] = field(default_factory=dict)
    secret_files: list[tuple[Path, str, str]] = field(default_factory=list)   # (path, mount path, env var)
    exclude: list[str] = field(default_factory=list)
    time_limit: float | None = None
    workdir: str | None = None          # where the launcher starts (the folder the run was submitted from)
    prelude: list[dict[str, Any]] = field(default_factory=list)   # steps before the command (integrations.py)
    postmortem: list[dict[str, Any]] = field(default_factory=list)  # steps after a failed command (GPU Xids)
    node_workdir: str | None = None     # the command's folder on each node, if not `workdir` (a template)


class ClusterBackend(ABC):
    """A place runs go. `handle`s are JSON-serialisable dicts kept in the state database, so a restarted
    supervisor can pick up every job it had."""

    type: str = ""

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self.name, self.config = name, config

    def check(self, spec: RunSpec) -> None:
        """Raise ClusterError if this cluster cannot run `spec` at all (checked before submission)."""
        return None

    @abstractmethod
    def submit(self, request: LaunchRequest) -> dict[str, Any]:
        """Start (or queue) all nodes of one resumption; returns the handle (with "job_id")."""

    @abstractmethod
    def find(self, request: LaunchRequest) -> dict[str, Any] | None:
        """The handle of the job `request` was submitted as, or None when no such job was created.

        A supervisor that died between `submit` and recording the handle calls this after its restart,
        so the job is adopted instead of orphaned (and never started twice). Raise ClusterError when
        the cluster cannot tell: None means "submit it again"."""

    @abstractmethod
    def status(self, handle: dict[str, Any]) -> JobStatus: ...

    @abstractmethod
    def terminate(self, handle: dict[str, Any]) -> None:
        """SIGTERM to every process of the job (the trainer checkpoints and exits)."""

    @abstractmethod
    def kill(self, handle: dict[str, Any]) -> None:
        """End the job now."""

    @abstractmethod
    def nodes(self) -> list[NodeInfo]: ...

    def cleanup(self, handle: dict[str, Any]) -> None:
        """Remove what the job no longer needs (materialised secrets) once it has ended."""
        folder = handle.get("folder")
        if folder:
            (Path(folder) / "secrets.json").unlink(missing_ok=True)
            shutil.rmtree(Path(folder) / "secrets", ignore_errors=True)  # decrypted secret files

    def log_path(self, folder: Path, node_rank: int) -> Path:
        return folder / f"node-{node_rank}.log"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, **self.config}


def write_launch_files(request: LaunchRequest, torchrun: list[str], *, grace: float,
                       secrets_in_file: bool, notes: list[str] | None = None) -> None:
    """command.sh (the user's command, verbatim), launch.json, launch.py, and (for schedulers that copy
    the submitting environment) secrets.json with mode 0600, deleted when the resumption ends."""
    folder = request.folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "command.sh").write_text(f"# run {request.run_name}, resumption {request.resumption}\n"
                                       f"{request.spec.command}\n", encoding="utf-8")
    config = {"procs_per_node": request.spec.compute.ranks_per_node, "torchrun": torchrun, "grace": grace,
              "workdir": request.node_workdir or request.workdir, "prelude": request.prelude,
              "postmortem": request.postmortem, "notes": list(notes or [])}
    (folder / "launch.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (folder / "launch.py").write_text(LAUNCHER.read_text(encoding="utf-8"), encoding="utf-8")
    for step in [*request.prelude, *request.postmortem]:   # scripts a step runs (GPU checks), beside launch.py
        for name, source in (step.get("files") or {}).items():
            shutil.copyfile(source, folder / name)
    if secrets_in_file and (request.secret_env or request.secret_files):
        secret_env = {**request.secret_env, **{var: str(path) for path, _, var in request.secret_files}}
        write_private(folder / "secrets.json", json.dumps(secret_env).encode())


def no_runtime_note(image: str) -> str:
    """The line a node's log gets when the run's image cannot be used here (the command runs anyway)."""
    return f"tessera: warning: image {image} requested; no container runtime on this host: running on the host"


def container_mounts(request: LaunchRequest) -> list[str]:
    """Host folders a containerised node needs at the same path: the run's folder (resumptions,
    parameters, metrics), the folder it was submitted from, and each secret file."""
    paths = [str(request.folder.parent)]
    if request.workdir:
        paths.append(str(request.workdir))
    paths += [str(path) for path, _, _ in request.secret_files]
    return list(dict.fromkeys(paths))


def read_node_exits(folder: Path) -> list[NodeExit]:
    out = []
    for path in sorted(folder.glob("node-*.exit")):
        try:
            body = json.loads(path.read_text())
            out.append(NodeExit(int(body["rank"]), str(body.get("node", "")), int(body["exit_code"]),
                                body.get("signal"), str(body.get("reason") or "")))
        except (OSError, ValueError, KeyError):
            continue
    return sorted(out, key=lambda e: e.rank)


def read_node_starts(folder: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for path in folder.glob("node-*.start"):
        try:
            body = json.loads(path.read_text())
            out[int(body["rank"])] = body
        except (OSError, ValueError, KeyError):
            continue
    return out


def hostname() -> str:
    return socket.gethostname().split(".")[0]


def shell_join(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
