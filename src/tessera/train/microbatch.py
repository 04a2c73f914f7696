"""Microbatches: splitting a per-device batch, and finding a microbatch size that fits in memory.

A batch is a tensor, a dict, or a list/tuple: one whose items are all tensors is a tuple of columns
(`(inputs, targets)`), any other is a list of samples. `split_batch` cuts every tensor along dim 0 and
every list of samples into the same slices, and leaves other values (strings, numbers) in each
microbatch as they are. `batch_size_of` is the length of the first tensor or list of samples it finds.

Gradient accumulation keeps the maths of the full batch: microbatch i's loss is scaled by its share of
the batch (`len(mb_i) / len(batch)`), so the summed gradient is that of the mean loss over the batch
(exactly so when the model's loss is a mean over samples).

Auto-microbatching (`AutoMicrobatch`): start at the whole per-device batch; when a step runs out of CUDA
memory (`torch.cuda.OutOfMemoryError`, a RuntimeError saying "out of memory", or `SimulatedOutOfMemory`
for tests on CPU) on any rank, every rank learns it through one all_reduce of a flag, halves its
microbatch, drops the partial gradients, restores the RNG state of the batch start and runs the same
batch again. The global batch and the maths are unchanged; only the number of microbatches grows.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from tessera.train.distributed import all_reduce_gradients, any_rank, gradient_sync


class SimulatedOutOfMemory(RuntimeError):
    """Raise this from a model to exercise auto-microbatching without a GPU."""


class MicrobatchTooSmall(RuntimeError):
    """A microbatch of one sample does not fit in memory: nothing left to halve."""


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, SimulatedOutOfMemory):
        return True
    if torch.cuda.is_available() and isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def batch_size_of(batch: Any) -> int:
    """Samples in `batch`: the length of its first tensor (dim 0) or list."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            raise ValueError("a 0-dimensional tensor is not a batch")
        return batch.shape[0]
    if isinstance(batch, Mapping):
        for value in batch.values():
            if isinstance(value, (torch.Tensor, list, tuple, Mapping)):
                return batch_size_of(value)
    elif isinstance(batch, (list, tuple)) and batch:
        if all(isinstance(v, torch.Tensor) for v in batch):  # (inputs, targets): a tuple of columns
            return batch_size_of(batch[0])
        return len(batch)
    raise TypeError(f"cannot tell the batch size of {type(batch).__name__}: a batch must hold a tensor or a "
                    f"list (of samples) at its top level or in a dict")


def split_batch(batch: Any, size: int) -> list[Any]:
    """`batch` cut into microbatches of `size` samples (the last may be smaller)."""
    n = batch_size_of(batch)
    if size >= n:
        return [batch]
    return [_slice(batch, start, min(start + size, n), n) for start in range(0, n, size)]


def _slice(value: Any, start: int, end: int, n: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value[start:end] if value.dim() and value.shape[0] == n else value
    if isinstance(value, Mapping):
        return {k: _slice(v, start, end, n) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, torch.Tensor) for v in value):  # columns, as in batch_size_of
            return type(value)(_slice(v, start, end, n) for v in value)
        if len(value) == n:
            return value[start:end]
    return value


def move_to(batch: Any, device: torch.device) -> Any:
    """Every tensor of `batch` on `device` (non-blocking from pinned memory)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: move_to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(v, device) for v in batch)
    return batch


def count_tokens(batch: Any) -> int:
    """Tokens in a batch, by convention: the `input_ids` or `tokens` tensor of a dict batch, or an integer
    tensor of 2+ dimensions given as the batch itself; 0 otherwise (pass `num_tokens_fn` to the Trainer)."""
    if isinstance(batch, Mapping):
        for key in ("input_ids", "tokens"):
            value = batch.get(key)
            if isinstance(value, torch.Tensor):
                return value.numel()
    elif isinstance(batch, torch.Tensor) and batch.dim() >= 2 and not batch.is_floating_point():
        return batch.numel()
    return 0


class AutoMicrobatch:
    """The current microbatch size, and the agreement between ranks when a step ran out of memory.

    `size=None` means the whole per-device batch; `auto=True` halves `size` on out-of-memory errors.
    """

    def __init__(self, size: int | None, auto: bool, device: torch.device) -> None:
        if size is not None and size < 1:
            raise ValueError(f"device_train_microbatch_size must be >= 1, got {size}")
        self.size, self.auto, self.device = size, auto, device
        self.retries = 0
        self.current = size  # the size the last batch was cut into (what a halving starts from)

    def size_for(self, batch_size: int) -> int:
        """The microbatch size to use for a per-device batch of `batch_size` samples.

        A short batch (an epoch's last) is one microbatch of its own size without lowering `size`: the
        batches after it are cut as before, so a run resumed after it does the same arithmetic."""
        self.current = batch_size if self.size is None else min(self.size, batch_size)
        return self.current

    def count(self, batch_size: int) -> int:
        return math.ceil(batch_size / self.size_for(batch_size))

    def agree(self, out_of_memory: bool) -> bool:
        """All ranks: True if any rank ran out of memory on this batch; then the microbatch is halved."""
        if not any_rank(out_of_memory, self.device):
            return False
        assert self.current is not None
        if self.current == 1:
            raise MicrobatchTooSmall("out of memory with a microbatch of 1 sample; use a smaller model, "
                                     "shard it (parallelism='fsdp'), or a lower precision")
        self.size = max(1, self.current // 2)
        self.retries += 1
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return True


def rng_snapshot(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The torch RNG states a forward/backward may draw from (CPU and this CUDA device)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def rng_restore(snapshot: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    cpu, cuda = snapshot
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


def forward_backward(batch: Any, microbatch: AutoMicrobatch, model: torch.nn.Module,
                     loss_of: Callable[[Any], torch.Tensor], backward: Callable[[torch.Tensor], None], *,
                     manual_sync: bool, on_retry: Callable[[], None]) -> torch.Tensor:
    """Forward and backward over the microbatches of one per-device batch; the batch's mean loss.

    `loss_of(mb)` is a microbatch's loss (the forward), `backward(loss)` runs the backward of its loss
    scaled by its share of the batch; DDP/FSDP sync on the last microbatch only, or with `manual_sync` by
    hand once at the end. With auto-microbatching, an out-of-memory error on any rank halves the microbatch
    on every rank, `on_retry()` drops the partial gradients, and the batch reruns from the same RNG state."""
    n = batch_size_of(batch)
    rng = rng_snapshot(microbatch.device) if microbatch.auto else None
    while True:
        loss, oom = None, False
        try:
            loss = _accumulate(batch, n, microbatch, model, loss_of, backward, manual_sync)
        except Exception as exc:
            if not (microbatch.auto and is_out_of_memory(exc)):
                raise
            oom = True
        if not microbatch.auto or not microbatch.agree(oom):
            if manual_sync:
                all_reduce_gradients(model)
            return loss
        on_retry()
        rng_restore(rng, microbatch.device)


def _accumulate(batch: Any, n: int, microbatch: AutoMicrobatch, model: torch.nn.Module,
                loss_of: Callable[[Any], torch.Tensor], backward: Callable[[torch.Tensor], None],
                manual_sync: bool) -> torch.Tensor:
    micro = split_batch(batch, microbatch.size_for(n))
    total = torch.zeros((), device=microbatch.device)
    for i, mb in enumerate(micro):
        share = batch_size_of(mb) / n
        last = i == len(micro) - 1 and not manual_sync
        with gradient_sync(model, enabled=last):
            loss = loss_of(mb)
            backward(loss * share)
        total += loss.detach().float() * share
    return total
