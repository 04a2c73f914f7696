"""Who am I in the job: the one place that reads rank, world size, local rank, node and rendezvous from
the environment. The stream layer's `World`, `tessera.train.distributed` and `tessera launch` all ask
here, so a dataset built before the trainer's set-up sees the same world as one built after it.

The world is decided from one source as a whole, never a mix of two (a launcher task under `srun` has
Slurm's variables *and* torchrun's, and they describe different processes):

1. explicit arguments (`resolve_world(rank=..., world_size=...)`), field by field, over
2. torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE, when any of them is set; missing ones
   default to rank 0 of 1, one node;
3. Slurm's SLURM_PROCID / SLURM_STEP_NUM_TASKS (or SLURM_NTASKS) / SLURM_LOCALID / SLURM_STEP_TASKS_PER_NODE
   (or SLURM_NTASKS_PER_NODE, else tasks / nodes), only inside a job step that `srun` started, where each
   task is one rank (SLURM_STEP_ID is a step number);
4. otherwise a single process: rank 0 of 1.

A shell or batch script in an allocation (`salloc`, `sbatch` without `srun`) is one process, whatever
SLURM_NTASKS says: there SLURM_NTASKS counts the tasks the allocation could run, not processes that
exist, and a world of 4 with no other ranks would wait forever for them.

Nothing here talks to other processes: the epoch plan is a pure function of these numbers, which is what
makes streaming elastic.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 29500
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
# Step ids Slurm gives the non-srun steps (batch script, extern, interactive and pending steps) are the
# top of the 32-bit range; a step started by srun is numbered from 0.
_SPECIAL_STEP_IDS = 0xFFFFFFF0
# Slurm writes counts such as "4(x2)" (4 on each of 2 nodes) or "4,3" (per node): the first count.
_COUNT = re.compile(r"\s*(-?\d+)\s*(?:\(x\d+\))?\s*(?:,.*)?")


class WorldError(ValueError):
    """The environment (or the arguments) describe no valid place in a job; the message names them."""


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """The integer in variable `name` (None when unset or empty); Slurm's "4(x2)" reads as 4."""
    value = env.get(name, "")
    if not value.strip():
        return None
    match = _COUNT.fullmatch(value)
    if match is None:
        raise WorldError(f"environment variable {name}={value!r} is not an integer")
    return int(match[1])


def _first_int(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[int | None, str | None]:
    for name in names:
        value = env_int(env, name)
        if value is not None:
            return value, name
    return None, None


def in_slurm_step(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a task that `srun` started (not a shell or batch script in an allocation,
    where SLURM_NTASKS describes the allocation, not this process)."""
    env = os.environ if env is None else env
    step = (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "").strip()
    return step.isdigit() and int(step) < _SPECIAL_STEP_IDS


def world_source(env: Mapping[str, str] | None = None) -> str:
    """Which variables decide the world: "torchrun", "slurm" or "single" (see the module's order)."""
    env = os.environ if env is None else env
    if any(env.get(name, "").strip() for name in TORCHRUN_VARIABLES):
        return "torchrun"
    return "slurm" if in_slurm_step(env) else "single"


# Per source: the variables of (rank, world size, local rank, local world size, nodes), first found wins.
_NAMES: dict[str, tuple[tuple[str, ...], ...]] = {
    "torchrun": (("RANK",), ("WORLD_SIZE",), ("LOCAL_RANK",), ("LOCAL_WORLD_SIZE",), ()),
    "slurm": (("SLURM_PROCID",), ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), ("SLURM_LOCALID",),
              ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"),
              ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")),
    "single": ((), (), (), (), ()),
}


@dataclass(frozen=True, init=False)
class World:
    """The position of this process (and DataLoader worker) in the job.

    Also built as MosaicML's is, `World(num_nodes=2, ranks_per_node=8, workers_per_rank=4, worker=37)`
    (`worker` counts every DataLoader worker of the job), and read through MosaicML's names (`num_ranks`,
    `ranks_per_node`, `rank_of_node`, `workers_per_rank`, `worker`, `worker_of_rank`, ...) except one:
    `num_workers` stays the workers of one rank (MosaicML's counts the whole job's: `num_workers_total`).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0, local_world_size: int = 1,
                 worker_id: int = 0, num_workers: int = 1, *, num_nodes: int | None = None,
                 ranks_per_node: int | None = None, workers_per_rank: int | None = None,
                 worker: int | None = None) -> None:
        mosaic = (num_nodes, ranks_per_node, workers_per_rank, worker)
        if any(v is not None for v in mosaic):
            if None in mosaic or (rank, world_size, local_rank, local_world_size, worker_id, num_workers) != (
                    0, 1, 0, 1, 0, 1):
                raise ValueError("World takes either Tessera's fields (rank, world_size, ...) or MosaicML's "
                                 "num_nodes, ranks_per_node, workers_per_rank and worker, all four")
            num_workers, local_world_size = int(workers_per_rank), int(ranks_per_node)  # type: ignore[arg-type]
            rank, worker_id = divmod(int(worker), num_workers)  # type: ignore[arg-type]
            world_size, local_rank = int(num_nodes) * local_world_size, rank % local_world_size  # type: ignore[arg-type]
        for name, value in (("rank", rank), ("world_size", world_size), ("local_rank", local_rank),
                            ("local_world_size", local_world_size), ("worker_id", worker_id),
                            ("num_workers", num_workers)):
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.local_world_size < 1:
            raise ValueError(f"world size {self.world_size} and ranks per node {self.local_world_size} must be "
                             "at least 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")
        if self.world_size % self.local_world_size:
            raise ValueError(f"world size {self.world_size} is not a multiple of the ranks per node "
                             f"{self.local_world_size}")
        if not 0 <= self.worker_id < self.num_workers:
            raise ValueError(f"worker {self.worker_id} is outside {self.num_workers} workers")

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def node(self) -> int:
        return self.rank // self.local_world_size

    # MosaicML's names for the same numbers.
    num_ranks = property(lambda self: self.world_size)
    ranks_per_node = property(lambda self: self.local_world_size)
    rank_of_node = property(lambda self: self.rank % self.local_world_size)
    is_multinode = property(lambda self: self.num_nodes > 1)
    workers_per_rank = property(lambda self: self.num_workers)
    workers_per_node = property(lambda self: self.local_world_size * self.num_workers)
    num_workers_total = property(lambda self: self.world_size * self.num_workers)
    worker = property(lambda self: self.rank * self.num_workers + self.worker_id)
    worker_of_rank = property(lambda self: self.worker_id)
    worker_of_node = property(lambda self: self.worker % self.workers_per_node)
    is_leader = property(lambda self: self.worker == 0)
    is_local_leader = property(lambda self: self.worker_of_node == 0)

    @classmethod
    def detect(cls) -> World:
        """MosaicML's name for `from_env`."""
        return cls.from_env()

    @classmethod
    def from_env(cls) -> World:
        """This process's ranks (`resolve_world`) and, inside a DataLoader worker, the worker's place."""
        worker_id, num_workers = 0, 1
        try:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            if info is not None:
                worker_id, num_workers = info.id, info.num_workers
        except ImportError:
            pass
        return resolve_world(worker_id=worker_id, num_workers=num_workers)


def resolve_world(env: Mapping[str, str] | None = None, *, rank: int | None = None,
                  world_size: int | None = None, local_rank: int | None = None,
                  local_world_size: int | None = None, worker_id: int = 0, num_workers: int = 1) -> World:
    """The world in the module's order: explicit arguments, else torchrun's variables, else Slurm's inside
    an srun step, else a single process. Raises `WorldError` naming the variables that disagree."""
    env = os.environ if env is None else env
    source = world_source(env)
    rank_names, world_names, local_names, local_world_names, node_names = _NAMES[source]
    used: dict[str, int] = {}

    def pick(explicit: int | None, names: tuple[str, ...]) -> int | None:
        if explicit is not None:
            return explicit
        value, name = _first_int(env, names)
        if name is not None and value is not None:
            used[name] = value
        return value

    rank_ = pick(rank, rank_names)
    world = pick(world_size, world_names)
    world = 1 if world is None else world
    rank_ = 0 if rank_ is None else rank_
    local_world = pick(local_world_size, local_world_names)
    if local_world is None:
        nodes = pick(None, node_names)
        local_world = max(1, world // max(1, nodes or 1))
    local = pick(local_rank, local_names)
    local = rank_ % max(1, local_world) if local is None else local
    origin = ", ".join(f"{k}={v}" for k, v in used.items()) or "explicit arguments"
    try:
        if not 0 <= local < local_world:
            raise ValueError(f"local rank {local} is outside the {local_world} ranks per node")
        return World(rank_, world, local, local_world, worker_id, num_workers)
    except ValueError as exc:
        raise WorldError(f"{exc} (read from {origin}; {source} decides the world)") from None


# --- Slurm's job, as a launcher with one task per node sees it ----------------------------------------


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: "gpu[07-09,12],cpu3" -> "gpu07", "r[1-2]-n[3-4]" -> "r1-n3"."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    first = nodelist[:end].strip()
    # Within each bracket group the first item's first value: "07-09,12" -> "07".
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m[1])[0], first)
    if not host:
        raise WorldError(f"cannot read a host name from the Slurm node list {nodelist!r}")
    return host


def slurm_master_port(env: Mapping[str, str] | None = None) -> int:
    """A port shared by every task of a Slurm job and unlikely to collide with other jobs on the node."""
    job = (os.environ if env is None else env).get("SLURM_JOB_ID", "")
    return 20000 + int(job) % 20000 if job.isdigit() else DEFAULT_PORT


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job around this process: what a launcher started once per node fills torchrun's
    --nnodes, --node-rank, --master-addr/port and --nproc-per-node from."""

    job_id: str
    nodes: int | None
    node_id: int | None
    nodelist: str
    gpus_on_node: int | None
    master_port: int

    @property
    def master_host(self) -> str | None:
        return first_host(self.nodelist) if self.nodelist else None


def slurm_job(env: Mapping[str, str] | None = None) -> SlurmJob | None:
    """The job this process runs in (None outside Slurm, i.e. without SLURM_JOB_ID)."""
    env = os.environ if env is None else env
    if "SLURM_JOB_ID" not in env:
        return None
    return SlurmJob(env["SLURM_JOB_ID"], _first_int(env, ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"))[0],
                    env_int(env, "SLURM_NODEID"), env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "",
                    _gpus_on_node(env), slurm_master_port(env))


def _gpus_on_node(env: Mapping[str, str]) -> int | None:
    """SLURM_GPUS_ON_NODE, else the count of SLURM_GPUS_PER_NODE, which may name a type ("a100:4")."""
    count = env_int(env, "SLURM_GPUS_ON_NODE")
    if count is not None:
        return count
    value = env.get("SLURM_GPUS_PER_NODE", "").rsplit(":", 1)[-1].strip()
    return int(value) if value.isdigit() else None


def rendezvous(env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Where rank 0 listens: MASTER_ADDR / MASTER_PORT, else inside an srun step the job's first node and
    a port from the job id, else 127.0.0.1:29500."""
    env = os.environ if env is None else env
    job = slurm_job(env) if in_slurm_step(env) else None
    host = job.master_host if job is not None else None
    addr = env.get("MASTER_ADDR") or host or "127.0.0.1"
    port = env_int(env, "MASTER_PORT") or (slurm_master_port(env) if host else DEFAULT_PORT)
    return addr, port
