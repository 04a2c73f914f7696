"""The update that ends a training step: unscale and clip the gradients, then step the optimizers.

Kept apart from the loop (trainer.py) because the order here is what keeps mixed precision and the
non-finite guard correct: the grad scaler's gradients are unscaled before they are clipped or measured;
under on_nonfinite="skip" the norm is always computed (it decides the skip; with fp16 the scaler's own
overflow check does), and a skipped step leaves the weights and the optimizer's state as they were
(nonfinite.py); the scaler updates once, after every optimizer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tessera.train.nonfinite import NonFiniteGuard
from tessera.train.parallel import clip_grad_norm_, total_grad_norm


def clip_gradients(model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer],
                   scaler: torch.amp.GradScaler, max_norm: float | None, skipping: bool) -> torch.Tensor | None:
    """The gradients' global norm after clipping them to `max_norm` (None without clipping). With `skipping`
    (on_nonfinite="skip") the gradients are always unscaled and the norm is computed (it decides the skip;
    fp16: the scaler's overflow check does)."""
    if max_norm is None and not skipping:
        return None
    for opt in optimizers:
        scaler.unscale_(opt)
    if max_norm is not None:
        norm = clip_grad_norm_(model.parameters(), max_norm)  # across meshes (TP)
    elif scaler.is_enabled():
        return None
    else:
        norm = total_grad_norm(model.parameters())
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def step_optimizers(optimizers: Sequence[torch.optim.Optimizer], scaler: torch.amp.GradScaler,
                    nonfinite: NonFiniteGuard, skip: torch.Tensor | None) -> None:
    """Step every optimizer through the scaler (or, when `skip` is a flag from `NonFiniteGuard.note`, only
    where the step was finite), clear its gradients, then update the scaler."""
    for opt in optimizers:
        if skip is None:
            scaler.step(opt)
        else:
            nonfinite.step_unless(skip, opt)
        opt.zero_grad(set_to_none=True)
    scaler.update()
