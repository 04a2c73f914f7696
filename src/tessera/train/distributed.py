"""Distributed set-up, apart from models and the loop: who am I, the process group, and the few
collectives the trainer needs. How a model is spread over the processes (DDP, FSDP2, tensor parallelism,
activation checkpointing, compile) is `tessera.train.parallel`'s.

    dist_env = init_distributed()               # from torchrun's or Slurm's variables; no-op for 1 process

Who is in the job is decided by `tessera.stream.world` alone (its docstring has the order): torchrun's
variables, else Slurm's in a task started by `srun` with one task per device (the first host of
SLURM_JOB_NODELIST as the master), else one process; a plain `python train.py` in an salloc shell or batch
script is one process, whatever SLURM_NTASKS says. `init_distributed` writes the torchrun names back
into the environment, so user code and the processes it starts see the same world without Slurm's rules.
The backend is nccl when the trainer runs on CUDA, gloo otherwise.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tessera.stream.forksafe import die_with_parent

# The world is read in one place, the stream layer's (the lowest that needs it); first_host is re-exported.
from tessera.stream.world import DEFAULT_PORT, rendezvous, resolve_world
from tessera.stream.world import first_host as first_host


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job. `world_size == 1` means no process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_from_environ() -> DistEnv:
    """This process's ranks as `tessera.stream.world` decides them (torchrun's variables, else Slurm's
    inside an srun step, else a single process), with the rendezvous address and port."""
    world = resolve_world()
    addr, port = rendezvous()
    return DistEnv(world.rank, world.world_size, world.local_rank, world.local_world_size, addr, port)


def current_env() -> DistEnv:
    """The running process group's ranks if there is one, else what the environment says (no side effects)."""
    if dist.is_available() and dist.is_initialized():
        world = resolve_world(rank=dist.get_rank(), world_size=dist.get_world_size())
        return DistEnv(world.rank, world.world_size, world.local_rank, world.local_world_size)
    return env_from_environ()


def default_device(env: DistEnv) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(device: torch.device | None = None, timeout_seconds: float = 1800.0) -> DistEnv:
    """Initialise the default process group when the job has several processes (idempotent).

    nccl on CUDA devices, gloo otherwise. Returns the job's `DistEnv`.
    """
    env = current_env()
    if dist.is_initialized():
        return env
    if env.world_size == 1:
        if "SLURM_NTASKS" in os.environ and "WORLD_SIZE" not in os.environ:
            os.environ.update(RANK="0", WORLD_SIZE="1")  # for user code that reads SLURM_NTASKS as a world
        return env
    export_env(env)
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # started by torchrun: a rank must not outlive it (a second
        die_with_parent()                      # Ctrl-C ends torchrun's wait for the ranks' checkpoint)
    device = device or default_device(env)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_seconds))
    return env


def export_env(env: DistEnv) -> None:
    """Write `env` under torchrun's names into this process's environment (what `init_process_group`'s
    env:// rendezvous and the processes started from here read)."""
    os.environ.update(RANK=str(env.rank), WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank),
                      LOCAL_WORLD_SIZE=str(env.local_world_size), MASTER_ADDR=env.master_addr,
                      MASTER_PORT=str(env.master_port))


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# --- gradient synchronisation (wrapping a model is tessera.train.parallel's) --------------------------


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """A context under which backward does (or, if not `enabled`, defers) the gradient collective."""
    from torch.nn.parallel import DistributedDataParallel

    if enabled:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


# --- collectives -----------------------------------------------------------------------------------------


def all_reduce_(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all_reduce ("sum", "max", "min", "mean") over the default group; identity for 1 process."""
    if not is_distributed():
        return tensor
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "mean": dist.ReduceOp.SUM}
    dist.all_reduce(tensor, op=ops[op])
    if op == "mean":
        tensor.div_(dist.get_world_size())
    return tensor


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if `flag` is True on any rank."""
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    return bool(all_reduce_(value, "max").item())


def step_counts(samples: int, tokens: int, stop: bool, group: dist.ProcessGroup | None,
                tp_degree: int) -> tuple[int, int, bool]:
    """A step's samples and tokens summed over the ranks of `group` (the ranks of a tensor-parallel group
    read one batch: counted once), and whether any rank asked to stop, in one collective; without a group,
    this process's own."""
    if group is None:
        return samples, tokens, stop
    counts = torch.tensor([samples, tokens, int(stop)], dtype=torch.int64)
    dist.all_reduce(counts, group=group)
    samples, tokens, stops = counts.tolist()
    return samples // tp_degree, tokens // tp_degree, stops > 0


def all_reduce_gradients(model: torch.nn.Module) -> None:
    """Average gradients over ranks by hand (after a backward under `no_sync`), one collective per dtype."""
    if not is_distributed():
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    world = dist.get_world_size()
    for dtype in sorted({g.dtype for g in grads}, key=str):
        same = [g for g in grads if g.dtype == dtype]
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat)
        flat.div_(world)
        offset = 0
        for g in same:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def destroy_group(group: dist.ProcessGroup | None) -> None:
    """Leave a process group of one's own (not the default one), if the job still has it. Drop the last
    reference to it after this: gloo's threads end only when the group object is freed."""
    if group is not None and dist.is_available() and dist.is_initialized() and group in _pg_map():
        dist.destroy_process_group(group)


def destroy() -> None:
    """Leave the default process group (and any group still left) last, after the objects that hold
    groups are released: garbage cycles that hold one (a trainer and its schedulers) are collected first,
    so the groups only they held end here and not among the destructors of interpreter exit."""
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _pg_map() -> dict:
    from torch.distributed.distributed_c10d import _world

    return _world.pg_map
