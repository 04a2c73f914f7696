"""Fault injection for the platform's tests: make a real `tessera train` or supervisor process die the
way a GPU job or a crashed host does. None of this is in the product.

Python imports `sitecustomize` at start-up from the first folder on its path that has one, so a test
that puts this folder on the PYTHONPATH of the processes it starts (`fault_env` in
tests/platform/platform_helpers.py) patches them before their own code runs. Unset variables patch
nothing:

- `TESSERA_FAULT_AT_STEP=N`: every `Trainer` gets a callback that raises
  `torch.OutOfMemoryError("CUDA out of memory. ...")` right after batch N's optimizer step (before that
  step's checkpoint, eval or heartbeat), so the process exits 1 with CUDA's message in its log. A CPU
  run never runs out of memory by itself. The fault fires every time the run passes that step: a test
  that wants it once sets the variable only while `TESSERA_RESUMPTION` is 0.
- `TESSERA_SUPERVISOR_FAULT=after_intent|after_submit`: the supervisor exits at once (status 70, as a
  killed process leaves things) right after writing a resumption's intent row, or right before storing
  the submitted job's id: the two windows `tessera.platform.supervision.submission` must survive.
"""

from __future__ import annotations

import os
import sys
from typing import Any

FAULT_AT_STEP = "TESSERA_FAULT_AT_STEP"
SUPERVISOR_FAULT = "TESSERA_SUPERVISOR_FAULT"
EXIT_CODE = 70


def _die(message: str) -> None:
    print(f"{message}: exiting at once (test fault injection)", file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)


def inject_out_of_memory(step: int) -> None:
    """Append an out-of-memory callback at `step` to every Trainer made from now on."""
    import torch

    from tessera.train.callbacks import Callback
    from tessera.train.trainer import Trainer

    class OutOfMemoryAtStep(Callback):
        def on_batch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
            if trainer.timestamp.batch == step:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by "
                                             f"{FAULT_AT_STEP}={step}, a test-only fault)")

    made = Trainer.__init__

    def __init__(self: Trainer, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        self.callbacks.append(OutOfMemoryAtStep())

    Trainer.__init__ = __init__  # type: ignore[method-assign]


def inject_supervisor_exit(point: str) -> None:
    """Exit at `point` of a submission, found through the state writes that bracket `backend.submit`."""
    from tessera.platform.store.state import StateDB

    if point == "after_intent":
        add_resumption = StateDB.add_resumption

        def add_then_die(self: StateDB, *args: Any, **kwargs: Any) -> Any:
            add_resumption(self, *args, **kwargs)
            _die(f"{SUPERVISOR_FAULT}={point}")

        StateDB.add_resumption = add_then_die  # type: ignore[method-assign]
    elif point == "after_submit":
        def die_instead(self: StateDB, *args: Any, **kwargs: Any) -> None:
            _die(f"{SUPERVISOR_FAULT}={point}")

        StateDB.record_submission = die_instead  # type: ignore[method-assign]
    else:
        raise ValueError(f"{SUPERVISOR_FAULT}={point!r}: expected after_intent or after_submit")


def install() -> None:
    step = os.environ.get(FAULT_AT_STEP, "").strip()
    if step:
        if not step.isdigit():
            raise ValueError(f"{FAULT_AT_STEP}={step!r}: expected a batch number")
        inject_out_of_memory(int(step))
    point = os.environ.get(SUPERVISOR_FAULT, "").strip()
    if point:
        inject_supervisor_exit(point)


install()
