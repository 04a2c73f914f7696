"""Who am I in the job: node, rank and DataLoader worker, from the environment.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE; under plain `srun` only Slurm's
variables exist, so they are the fallback. Nothing here talks to other processes: the epoch plan is
a pure function of these numbers, which is what makes streaming elastic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _env_int(*names: str, default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError as exc:
                raise ValueError(f"environment variable {name}={value!r} is not an integer") from exc
    return default


@dataclass(frozen=True)
class World:
    """The position of this process (and DataLoader worker) in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
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

    @classmethod
    def from_env(cls) -> World:
        """Ranks from torchrun's variables, else Slurm's, else a single process; workers from torch."""
        world_size = _env_int("WORLD_SIZE", "SLURM_NTASKS", default=1)
        rank = _env_int("RANK", "SLURM_PROCID", default=0)
        local_world = _env_int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", default=0)
        if not local_world:
            nodes = _env_int("SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1)
            local_world = max(1, world_size // max(1, nodes))
        local_rank = _env_int("LOCAL_RANK", "SLURM_LOCALID", default=rank % local_world)
        worker_id, num_workers = 0, 1
        try:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            if info is not None:
                worker_id, num_workers = info.id, info.num_workers
        except ImportError:
            pass
        return cls(rank, world_size, local_rank, local_world, worker_id, num_workers)
