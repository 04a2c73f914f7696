"""The model contract and the eval loop.

`model(batch)` (or `loss_fn(model, batch)`) returns a scalar loss tensor averaged over the batch's
samples, or a dict with "loss" and any other scalar metrics. `evaluate` averages each of them over
every sample of the eval dataloader on every rank (weighted by batch size).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from tessera.train.distributed import all_reduce_
from tessera.train.microbatch import batch_size_of, move_to

LossFn = Callable[[torch.nn.Module, Any], Any]


def model_outputs(model: torch.nn.Module, batch: Any, loss_fn: LossFn | None) -> dict[str, torch.Tensor]:
    """{"loss": scalar, ...} from the model (or loss_fn), checked against the contract."""
    out = loss_fn(model, batch) if loss_fn is not None else model(batch)
    out = dict(out) if isinstance(out, Mapping) else {"loss": out}
    loss = out.get("loss")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"the model (or loss_fn) must return a scalar loss tensor or a dict with a scalar "
                        f"'loss'; got {type(loss).__name__ if not isinstance(loss, torch.Tensor) else loss.shape}")
    return out


def evaluate(model: torch.nn.Module, dataloader: Any, device: torch.device, *, loss_fn: LossFn | None = None,
             autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
             max_batches: int | None = None) -> dict[str, float]:
    """{"eval/loss": ..., "eval/<metric>": ...} over the dataloader (or its first `max_batches`), all ranks."""
    was_training = model.training
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    try:
        with torch.no_grad(), autocast():
            for batch in itertools.islice(dataloader, max_batches):
                batch = move_to(batch, device)
                n = batch_size_of(batch)
                for key, value in model_outputs(model, batch, loss_fn).items():
                    sums[key] = sums.get(key, 0) + value.detach().float().reshape(()) * n
                sums[" samples"] = sums.get(" samples", 0) + torch.tensor(float(n), device=device)
    finally:
        model.train(was_training)
    keys = sorted(sums)  # the same order on every rank
    totals = all_reduce_(torch.stack([sums[k] for k in keys])).tolist() if keys else []
    values = dict(zip(keys, totals, strict=True))
    samples = values.pop(" samples", 0.0)
    return {f"eval/{key}": value / samples for key, value in values.items()} if samples else {}
