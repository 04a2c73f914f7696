"""Fault injection, for tests only: make a real training run fail the way a GPU job fails, at a chosen step.

The platform's tests (tests/platform/test_fault_injection.py) need the real trainer to die with an out-of-memory
error, which a CPU run never does by itself. Nothing happens unless the variable is set:

    TESSERA_FAULT_AT_STEP=20 tessera train tiny-cpu.yaml ...

raises `torch.OutOfMemoryError("CUDA out of memory. ...")` right after batch 20's optimizer step (before
that step's checkpoint, eval or heartbeat), so the process exits 1 with CUDA's message in its log. The
fault fires every time the run passes that step: a test that wants it once sets the variable only for
the first attempt (e.g. `[ "$TESSERA_RESUMPTION" = 0 ] && export TESSERA_FAULT_AT_STEP=20`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from tessera.train.callbacks import Callback

if TYPE_CHECKING:
    from tessera.train.trainer import Trainer

ENV_STEP = "TESSERA_FAULT_AT_STEP"


class OutOfMemoryAtStep(Callback):
    """Raises a CUDA-like out-of-memory error when the trainer finishes batch `step`."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_batch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if trainer.timestamp.batch == self.step:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by {ENV_STEP}={self.step}, "
                f"a test-only fault)")


def faults_from_env() -> list[Callback]:
    """The fault callbacks `TESSERA_FAULT_AT_STEP` asks for: none when it is unset or empty."""
    value = os.environ.get(ENV_STEP, "").strip()
    if not value:
        return []
    if not value.isdigit():
        raise ValueError(f"{ENV_STEP}={value!r}: expected a batch number (a test-only fault injection)")
    return [OutOfMemoryAtStep(int(value))]
