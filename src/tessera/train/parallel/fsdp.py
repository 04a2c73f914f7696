"""Data parallelism: DDP, and FSDP2 (`fully_shard`) block by block, full, grad-op or hybrid sharding.

FSDP2 shards each block on its own, then the root (whatever is left: embeddings, final norm), so at most a
block or two of whole parameters exist at a time. Which modules are blocks is the model's to say
(`fsdp_units`); the train layer does the sharding.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from tessera.train.parallel.plan import ParallelPlan


def fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules FSDP2 shards on their own, as the model says what its blocks are: its `fsdp_units()`
    or `blocks()` method; else the modules of the classes a Hugging Face model lists in
    `_no_split_modules` (its decoder layers); else every element of every `nn.ModuleList` (transformer
    blocks). The root is always sharded last, on top."""
    for name in ("fsdp_units", "blocks"):
        method = getattr(model, name, None)
        if callable(method) and not isinstance(method, torch.nn.Module):  # a method, not a `blocks` ModuleList
            return list(method())
    no_split = {name for module in model.modules() for name in (getattr(module, "_no_split_modules", None) or ())}
    if no_split:
        return [module for module in model.modules() if type(module).__name__ in no_split]
    units = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            units.extend(module)
    return units


def _dtype(name: str | None) -> torch.dtype | None:
    return getattr(torch, name) if name else None


def apply_fsdp(model: torch.nn.Module, units: list[torch.nn.Module], plan: ParallelPlan, dp_mesh: Any,
               device: torch.device) -> None:
    """`fully_shard` every unit, then the root, on `dp_mesh` (2-D for hybrid: replicate x shard)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=_dtype(plan.param_dtype),
                              reduce_dtype=_dtype(plan.reduce_dtype or plan.param_dtype))
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if plan.cpu_offload else OffloadPolicy()
    for unit in units:
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=plan.reshard_after_forward, mp_policy=mp,
                    offload_policy=offload)
    # The root's parameters (embeddings, final norm) are used last in backward: keeping them gathered after
    # forward saves one all-gather, as torchtitan does.
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=False, mp_policy=mp, offload_policy=offload)


def apply_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def _plain_name(name: str) -> str:
    """A parameter's name without the wrappers compile and checkpoint wrappers insert."""
    return name.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", "")


def parameter_names(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): _plain_name(name) for name, p in model.named_parameters()}


def rebind_optimizers(optimizers: Iterable[torch.optim.Optimizer], old_names: dict[int, str],
                      model: torch.nn.Module) -> None:
    """Point the optimizers at the parameters that replaced the old ones (sharded or split, matched by name)."""
    new_params = {_plain_name(name): p for name, p in model.named_parameters()}
    for opt in optimizers:
        if opt.state:
            raise ValueError("an optimizer that has already stepped cannot be moved to sharded parameters; "
                             "create the optimizers before training starts")
        for group in opt.param_groups:
            try:
                group["params"] = [new_params[old_names[id(p)]] for p in group["params"]]
            except KeyError:
                raise ValueError("an optimizer holds a parameter that is not in the model; pass optimizers "
                                 "built from model.parameters()") from None
