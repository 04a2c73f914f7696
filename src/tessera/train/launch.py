"""`tessera launch`: a thin wrapper over `torch.distributed.run` (torchrun) that also reads Slurm.

    tessera launch -n 4 train.py --lr 3e-4             # one node, 4 processes (torchrun --standalone)
    srun --nodes 2 --ntasks-per-node 1 tessera launch -n 8 train.py   # 2 nodes x 8, from Slurm's variables

Under Slurm, with one launcher task per node, what is not given on the command line comes from the job:
--nnodes from SLURM_JOB_NUM_NODES (or SLURM_NNODES), --node-rank from SLURM_NODEID, --master-addr from
the first host of SLURM_JOB_NODELIST, --master-port from the job id (the same on every node), and -n
from SLURM_GPUS_ON_NODE when unset. Without Slurm and one node, torchrun runs `--standalone` (it picks a
free port itself). If srun starts one task per device instead, don't use a launcher at all: the
trainer reads SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID directly. Both readings are
`tessera.stream.world`'s, the one module that parses the job's variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tessera.stream.world import DEFAULT_PORT, slurm_job


@dataclass(frozen=True)
class LaunchPlan:
    """What torchrun is asked to run."""

    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str | None
    master_port: int | None

    def torchrun_args(self, script: str, script_args: Sequence[str], module: bool = False) -> list[str]:
        """torchrun's arguments; `module`: `script` is a Python module run as `python -m` (`tessera train -n`
        runs `tessera.cli.main` this way, in every process)."""
        args = [f"--nproc-per-node={self.nproc_per_node}"]
        if self.nnodes == 1 and self.master_addr is None:
            args.append("--standalone")
        else:
            args += [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}",
                     f"--master-addr={self.master_addr or '127.0.0.1'}",
                     f"--master-port={self.master_port or DEFAULT_PORT}"]
        return [*args, *(["-m"] if module else []), script, *script_args]


def plan_launch(nproc_per_node: int | None = None, nnodes: int | None = None, node_rank: int | None = None,
                master_addr: str | None = None, master_port: int | None = None,
                env: Mapping[str, str] | None = None) -> LaunchPlan:
    """Fill what the command line left out from Slurm's job (`tessera.stream.world.slurm_job`), if any,
    then from defaults."""
    job = slurm_job(os.environ if env is None else env)
    if job is not None:
        nnodes = nnodes or job.nodes
        node_rank = node_rank if node_rank is not None else job.node_id
        if master_addr is None and (nnodes or 1) > 1:
            master_addr = job.master_host
        if master_port is None and (nnodes or 1) > 1:
            master_port = job.master_port
        nproc_per_node = nproc_per_node or job.gpus_on_node
    if nproc_per_node is None:
        try:
            import torch

            nproc_per_node = torch.cuda.device_count() or 1
        except ImportError:
            nproc_per_node = 1
    nnodes = nnodes or 1
    node_rank = node_rank or 0
    if nproc_per_node < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"bad launch: {nproc_per_node} process(es) per node, node {node_rank} of {nnodes}")
    return LaunchPlan(nproc_per_node, nnodes, node_rank, master_addr, master_port)


def launch(plan: LaunchPlan, script: str, script_args: Sequence[str], module: bool = False) -> int:
    """Run torchrun in this process; the exit code (non-zero if any worker failed, 128 + the signal when
    SIGINT or SIGTERM stopped it: torchrun sends it on to the workers and waits for them, up to
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds, 30 by default; a second signal ends that wait)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(plan.torchrun_args(script, script_args, module))
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        failures = list(exc.failures.values())
        code = failures[0].exitcode if failures else 1
        return code if code > 0 else 1
    return 0
