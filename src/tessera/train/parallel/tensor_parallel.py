"""Tensor parallelism: the model says which of its modules split how (`tp_plan()`: module-name pattern ->
style name), and this module applies those styles with DTensor's parallel styles over the `tp` mesh
dimension (Megatron's layout, as torchtitan applies it):

    colwise              a linear's output features split (ColwiseParallel): input whole, output split
    colwise_fused_qkv    a fused [q; k; v] projection: each rank keeps its heads' columns of q, k and v
                         (the weight stays whole: FusedColwiseParallel says why)
    rowwise              a linear's input features split (RowwiseParallel): partial outputs all-reduced
    rowwise_to_sequence  the same, reduce-scattered along the sequence instead (sequence parallelism)
    sequence_parallel    a norm run on this rank's part of the sequence (SequenceParallel)
    a+b                  both styles on the same modules (a one-block model's first and last block)
    sequence_input       a block's input cut along the sequence (the first block)
    sequence_output      a block's output gathered along the sequence (the last block)
    attention_input      an attention module's input gathered along the sequence, and an additive mask
                         with one slice per head (ALiBi) cut to this rank's heads
    mlp_input            an MLP's input gathered along the sequence

A Hugging Face model needs no method: its config's `base_model_tp_plan` (transformers writes one for
Llama-family models) gives the colwise/rowwise layers. Without sequence parallelism the sequence styles
are left out and rowwise_to_sequence is rowwise.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.placement_types import _StridedShard


class FusedColwiseParallel(ParallelStyle):
    """A fused projection whose output is `parts` equal chunks (q, k, v), each split over the ranks: rank r
    gets [q_r | k_r | v_r], which the model splits in three as usual.

    The weight stays whole (a replicated DTensor) and every rank computes the whole projection, then keeps
    its columns; the backward gathers the columns' gradients, so the weight's gradient is whole and the
    same on every rank. Sharding the weight itself would need a strided layout (each rank a third of q,
    of k and of v) that checkpoints (torch.distributed.checkpoint) cannot store, so the fused projection
    trades its share of memory and compute for checkpoints that reshard to any layout."""

    def __init__(self, parts: int = 3) -> None:
        super().__init__()
        self.parts = parts

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        parts = self.parts

        def whole_input(_module: nn.Module, inputs: tuple[Any, ...], mesh: Any) -> tuple[Any, ...]:
            x = inputs[0]
            return (x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [Replicate()], run_check=False),
                    *inputs[1:])

        def own_columns(_module: nn.Module, output: Any, mesh: Any) -> Any:
            split = _StridedShard(output.ndim - 1, split_factor=parts)
            return output.redistribute(placements=[split]).to_local()

        return distribute_module(module, device_mesh, input_fn=whole_input, output_fn=own_columns)


class AttentionInput(ParallelStyle):
    """Before an attention module: the hidden states whole (gathered along the sequence when they arrive
    split), and a mask with one slice per head cut to this rank's heads (contiguous, as the colwise split
    of the projections gives them). The other arguments pass unchanged."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        degree, rank = device_mesh.size(), device_mesh.get_local_rank()

        def prepare(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            x, *rest = args
            if isinstance(x, DTensor):  # sequence parallelism: this rank's part of the sequence
                x = x.redistribute(placements=[Replicate()]).to_local()
            if rest and torch.is_tensor(rest[0]) and rest[0].dim() >= 3 and rest[0].size(-3) > 1:
                heads = rest[0].size(-3)
                if heads % degree:
                    raise ValueError(f"{heads} attention heads cannot be split over tensor_parallel.degree={degree}")
                rest[0] = rest[0].narrow(-3, rank * heads // degree, heads // degree)
            return (x, *rest)

        module.register_forward_pre_hook(prepare)
        return module


class SequenceInput(ParallelStyle):
    """Before the first block: its (whole) hidden states cut along the sequence, kept a DTensor so the
    residual stream stays split; the block's other arguments pass unchanged."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        def prepare(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            x, *rest = args
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
            return (x.redistribute(placements=[Shard(1)]), *rest)

        module.register_forward_pre_hook(prepare)
        return module


def _style(name: str, sequence_parallel: bool) -> ParallelStyle | None:
    """The parallel style a plan names (None: nothing to do for it)."""
    sp = sequence_parallel
    gathered = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    styles: dict[str, Any] = {
        "colwise": ColwiseParallel,
        "colwise_fused_qkv": FusedColwiseParallel,
        "rowwise": RowwiseParallel,
        "rowwise_to_sequence": (lambda: RowwiseParallel(output_layouts=Shard(1), use_local_output=False)) if sp
        else RowwiseParallel,
        "sequence_parallel": SequenceParallel if sp else None,
        "sequence_input": SequenceInput if sp else None,
        "sequence_output": (lambda: PrepareModuleOutput(output_layouts=(Shard(1),),
                                                        desired_output_layouts=(Replicate(),))) if sp else None,
        "attention_input": AttentionInput,
        "mlp_input": (lambda: gathered) if sp else None,
    }
    if name not in styles:
        raise ValueError(f"unknown tensor-parallel style {name!r} in the model's tp_plan(); known: {sorted(styles)}")
    make = styles[name]
    return make() if make is not None else None


def tp_plan(model: nn.Module) -> dict[str, str]:
    """The model's plan: its `tp_plan()`, else a Hugging Face config's `base_model_tp_plan` (colwise and
    rowwise entries, under the wrapped model's prefix)."""
    method = getattr(model, "tp_plan", None)
    if callable(method):
        return dict(method())
    raise ValueError(f"{type(model).__name__} has no tensor-parallel plan (a tp_plan() method naming how its "
                     "layers split); set parallelism.tensor_parallel.degree=1")


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, sequence_parallel: bool = True) -> list[str]:
    """Split the model's layers over `tp_mesh` as its plan says; the names of the modules split."""
    names = [name for name, _ in model.named_modules()]
    applied = []
    for pattern, style_names in tp_plan(model).items():
        matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise ValueError(f"the model's tp_plan() names {pattern!r}, which matches no module")
        for style_name in style_names.split("+"):  # "a+b": both styles on the same modules
            style = _style(style_name, sequence_parallel)
            if style is None:
                continue
            for name in matched:
                module = model.get_submodule(name)
                if isinstance(style, ColwiseParallel | RowwiseParallel) and not isinstance(module, nn.Linear):
                    raise ValueError(f"tensor parallelism splits linear layers, but {name} is a "
                                     f"{type(module).__name__} (LoRA adapters are not split yet); set "
                                     "parallelism.tensor_parallel.degree=1")
                parallelize_module(module, tp_mesh, style)
                applied.append(name)
    return applied
