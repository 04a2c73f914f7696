"""Compiling blocks and float8 matmuls: speed knobs applied block by block, as torchtitan does, so a graph
break in one block costs that block only and the compiled code is reused by every identical block."""

from __future__ import annotations

import torch

from tessera.train.parallel.plan import float8_available


def compile_blocks(blocks: list[torch.nn.Module]) -> None:
    """`torch.compile` each block in place (`Module.compile`: parameter names do not change)."""
    for block in blocks:
        block.compile()


def convert_to_float8(model: torch.nn.Module, device_type: str) -> None:
    """Swap the linear layers of the blocks for torchao's float8 ones (dynamic scaling). Layers whose
    sizes are not multiples of 16 (float8 matmul tiles) and the output layer stay as they are."""
    float8_available(device_type)
    from torchao.float8 import convert_to_float8_training

    def eligible(module: torch.nn.Module, name: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and "lm_head" not in name
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)

    convert_to_float8_training(model, module_filter_fn=eligible)
