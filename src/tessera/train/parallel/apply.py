"""`parallelize`: a plan applied to a model, in torchtitan's order: tensor parallelism -> float8 ->
activation checkpointing -> compile -> FSDP (or DDP)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from tessera.train.parallel.activation_checkpoint import apply_activation_checkpointing
from tessera.train.parallel.compile import compile_blocks, convert_to_float8
from tessera.train.parallel.config import ParallelismConfig
from tessera.train.parallel.fsdp import apply_ddp, apply_fsdp, fsdp_units, parameter_names, rebind_optimizers
from tessera.train.parallel.mesh import build_mesh, submesh
from tessera.train.parallel.plan import ParallelPlan, resolve_plan

log = logging.getLogger(__name__)


def parallelize(model: torch.nn.Module, plan: ParallelPlan | ParallelismConfig | str | None, device: torch.device,
                optimizers: Sequence[torch.optim.Optimizer] = ()) -> torch.nn.Module:
    """Move `model` to `device` and apply the plan (a config or shorthand is resolved for the running
    world). Split or sharded parameters replace the old ones, so the optimizers' parameter groups are
    re-pointed to them (the optimizers must have no state yet). Returns the model (DDP wraps it)."""
    if not isinstance(plan, ParallelPlan):
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        plan = resolve_plan(plan, world, device_type=device.type)
    model = model.to(device)
    if plan.model_dtype:
        model = model.to(getattr(torch, plan.model_dtype))  # in place: the optimizers keep their parameters
    names = parameter_names(model)
    mesh = build_mesh(plan, device.type)
    if plan.tp_degree > 1:
        from tessera.train.parallel.tensor_parallel import apply_tensor_parallel

        split = apply_tensor_parallel(model, submesh(mesh, ("tp",)), plan.sequence_parallel)
        log.debug("tensor parallel over %d: %s", plan.tp_degree, split)
    if plan.float8:
        convert_to_float8(model, device.type)
    blocks = fsdp_units(model)
    apply_activation_checkpointing(blocks, plan.activation_checkpointing, plan.checkpoint_every)
    if plan.compile:
        compile_blocks(blocks)
    if plan.data_parallel == "fsdp":
        apply_fsdp(model, blocks, plan, submesh(mesh, plan.dp_dims), device)
    elif plan.data_parallel == "ddp":
        return apply_ddp(model, device)  # over every process: the plan refuses ddp with tensor parallelism
    if plan.tp_degree > 1 or plan.data_parallel == "fsdp":
        rebind_optimizers(optimizers, names, model)
    if device.type == "cuda":
        fuse_adam(optimizers)
    return model


def fuse_adam(optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Adam/AdamW built on the CPU (before the model moved to its GPU) switched to the fused CUDA kernel, one
    launch for every parameter's update, where torch allows it: every parameter on CUDA and of one kind
    (all DTensors or all plain tensors: tensor parallelism leaves embeddings plain)."""
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Adam | torch.optim.AdamW) or opt.state:
            continue
        params = [p for group in opt.param_groups for p in group["params"]]
        kinds = {hasattr(p, "device_mesh") for p in params}
        if params and len(kinds) == 1 and all(p.device.type == "cuda" and p.is_floating_point() for p in params):
            for group in opt.param_groups:
                group.update(fused=True, foreach=False)
            opt._step_supports_amp_scaling = True  # type: ignore[attr-defined]  # as torch sets it for fused
        elif len(kinds) > 1:
            for group in opt.param_groups:  # foreach kernels cannot mix DTensors and tensors
                group.update(fused=False, foreach=False)
            opt._step_supports_amp_scaling = False  # type: ignore[attr-defined]

