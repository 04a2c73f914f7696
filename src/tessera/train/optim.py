"""Optimizers the recipes name. `DecoupledAdamW` (and `DecoupledLionW`): weight decay that follows the LR
schedule, not the LR.

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


class DecoupledLionW(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") as LLM Foundry's
    DecoupledLionW: the update is the sign of a blend of the gradient and its moving average (beta1),
    the average then moves with beta2, and weights shrink by weight_decay x (current lr / initial lr)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})
        for group in self.param_groups:
            group.setdefault("initial_lr", lr)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), decay = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                avg = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                if decay:
                    p.mul_(1 - decay * (lr / group["initial_lr"] if group["initial_lr"] else 1.0))
                p.add_(avg.lerp(p.grad, 1 - beta1).sign_(), alpha=-lr)
                avg.lerp_(p.grad, 1 - beta2)
        return loss


def build_optimizer(name: str, params: Iterable[Any], *, lr: float, betas: tuple[float, float], eps: float,
                    weight_decay: float) -> torch.optim.Optimizer:
    """The optimizer a recipe names ("decoupled_adamw", "adamw" or "decoupled_lionw"); Adam is fused (one CUDA kernel for every
    parameter's update) when the parameters are on CUDA (train/parallel fuses it later for a model that is
    moved to a GPU after the optimizer was built)."""
    params = list(params)
    fused = True if params and all(p.device.type == "cuda" for p in params) else None
    if name == "decoupled_adamw":
        return DecoupledAdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
    if name == "decoupled_lionw":  # no eps: Lion divides by nothing
        return DecoupledLionW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; use decoupled_adamw, adamw or decoupled_lionw")
