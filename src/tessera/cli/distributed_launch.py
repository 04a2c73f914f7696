"""`tessera launch -n N script.py [args...]`: start a distributed training script on this node (the plan is
tessera.train.launch's; this module is only its command line)."""

from __future__ import annotations

import shlex
import sys

import typer

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


def launch(ctx: typer.Context,
           script: str = typer.Argument(..., help="The training script; everything after it is passed to it."),
           nproc_per_node: int = typer.Option(None, "-n", "--nproc-per-node",
                                              help="Processes per node (default: Slurm's GPUs, else CUDA "
                                                   "devices, else 1)."),
           nnodes: int = typer.Option(None, "--nnodes", help="Nodes (default: Slurm's, else 1)."),
           node_rank: int = typer.Option(None, "--node-rank", help="This node's rank (default: SLURM_NODEID)."),
           master_addr: str = typer.Option(None, "--master-addr", help="Rendezvous host (default: first Slurm node)."),
           master_port: int = typer.Option(None, "--master-port", help="Rendezvous port."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print the torchrun command and exit.")) -> None:
    """Run SCRIPT on N processes per node through torchrun, with Slurm's variables mapped to torchrun's."""
    from tessera.train.launch import launch as run_launch
    from tessera.train.launch import plan_launch

    try:
        plan = plan_launch(nproc_per_node, nnodes, node_rank, master_addr, master_port)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    args = plan.torchrun_args(script, list(ctx.args))
    if dry_run:
        typer.echo(shlex.join([sys.executable, "-m", "torch.distributed.run", *args]))
        return
    raise typer.Exit(run_launch(plan, script, list(ctx.args)))
