"""Optimizers the recipes name. `DecoupledAdamW`: weight decay that follows the LR schedule, not the LR.

torch's AdamW shrinks weights by lr * weight_decay per step, so changing the peak LR also changes the
regularisation. Decoupled (Loshchilov & Hutter, as in Composer/LLM Foundry): the shrink is
weight_decay * (lr / initial_lr), so `weight_decay` means the same at any learning rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class DecoupledAdamW(torch.optim.AdamW):
    """AdamW whose decay per step is weight_decay x (current lr / initial lr)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0, fused: bool | None = None) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
        for group in self.param_groups:
            # not "decoupled_weight_decay": torch.optim.Adam already uses that key (a bool)
            group["decay_per_unit_lr_schedule"] = weight_decay
            group.setdefault("initial_lr", lr)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            # AdamW applies p *= 1 - lr * wd; choose wd so that lr * wd = decay * lr / initial_lr.
            group["weight_decay"] = group["decay_per_unit_lr_schedule"] / group["initial_lr"]
        return super().step(closure)


def build_optimizer(name: str, params: Iterable[Any], *, lr: float, betas: tuple[float, float], eps: float,
                    weight_decay: float) -> torch.optim.Optimizer:
    """The optimizer a recipe names ("decoupled_adamw" or "adamw"); fused (one CUDA kernel for every
    parameter's update) when the parameters are on CUDA (train/parallel fuses it later for a model that is
    moved to a GPU after the optimizer was built)."""
    params = list(params)
    fused = True if params and all(p.device.type == "cuda" for p in params) else None
    if name == "decoupled_adamw":
        return DecoupledAdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
    raise ValueError(f"unknown optimizer {name!r}; use decoupled_adamw or adamw")
