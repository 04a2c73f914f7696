"""The gradients' global norm and clipping when parameters live on different meshes: under tensor
parallelism the split layers' parameters are DTensors on the tp mesh while replicated ones (embeddings,
final norm) stay plain tensors, and torch's clip_grad_norm_ cannot stack norms of both kinds. Each kind
gets its own norm (a DTensor's is reduced over its mesh), and the scaling is applied to local shards."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def _groups(params: Iterable[torch.nn.Parameter]) -> dict[object, list[torch.Tensor]]:
    groups: dict[object, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            key = (p.grad.device_mesh, p.grad.placements) if isinstance(p.grad, DTensor) else None
            groups.setdefault(key, []).append(p.grad)
    return groups


def total_grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """The 2-norm of all gradients together, a plain tensor (the same on every rank)."""
    norms = []
    for grads in _groups(params).values():
        norm = torch.nn.utils.get_total_norm(grads)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def clip_grad_norm_(params: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale all gradients so their global norm is at most `max_norm`; the norm before clipping."""
    params = list(params)
    groups = _groups(params)
    if len(groups) <= 1:  # one kind of tensor: torch's own
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    norm = total_grad_norm(params)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for grads in groups.values():
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        torch._foreach_mul_(local, coef.to(local[0].device))
    return norm
