"""Activation checkpointing: a block keeps only its input, and the backward reruns its forward.

`full` checkpoints every block, `every_n` every n-th one. `selective` is op-level (torchtitan's "op SAC"):
every block's forward keeps the outputs of the expensive operations (attention kernels, and every other
matmul) and recomputes the rest (norms, activations, the other matmuls), which costs little compute for
most of the memory saving.

The block's `forward` is replaced in place instead of wrapping the module, so parameter names (and so
checkpoints, exports and optimizer state) are the same with and without it. FSDP, applied after, gathers
a block's parameters before its backward, which is when the recomputation runs.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


def _save_list() -> set[Any]:
    """Ops whose outputs selective checkpointing keeps: the attention kernels (every backend) and matmuls."""
    aten = torch.ops.aten
    names = ["mm", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu", "max"]
    ops = {getattr(aten, name).default for name in names if hasattr(aten, name)}
    functional = getattr(torch.ops, "_c10d_functional", None)
    if functional is not None and hasattr(functional, "reduce_scatter_tensor"):
        ops.add(functional.reduce_scatter_tensor.default)  # a collective is costlier to redo than to keep
    return ops


def _selective_context() -> Any:
    """Keep the save list's outputs, except every second matmul (counted separately in the forward and in
    the recomputation, so both make the same choices)."""
    save, counts = _save_list(), defaultdict(int)
    mm = torch.ops.aten.mm.default

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func == mm:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            if counts[key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def checkpoint_block(block: torch.nn.Module, selective: bool = False) -> None:
    """Make `block` recompute its forward in backward (non-reentrant checkpointing)."""
    forward = block.forward
    kwargs: dict[str, Any] = {"use_reentrant": False, "preserve_rng_state": True}
    if selective:
        kwargs["context_fn"] = _selective_context

    @functools.wraps(forward)
    def checkpointed(*args: Any, **inputs: Any) -> Any:
        if not torch.is_grad_enabled():  # eval and generation: nothing to save for
            return forward(*args, **inputs)
        return checkpoint(forward, *args, **inputs, **kwargs)

    block.forward = checkpointed  # type: ignore[method-assign]


def apply_activation_checkpointing(blocks: list[torch.nn.Module], mode: str, every: int = 1) -> list[int]:
    """Checkpoint the blocks `mode` says ("none", "full", "every_n", "selective"); their indices."""
    if mode == "none":
        return []
    chosen = [i for i in range(len(blocks)) if mode != "every_n" or i % every == 0]
    for i in chosen:
        checkpoint_block(blocks[i], selective=mode == "selective")
    return chosen
