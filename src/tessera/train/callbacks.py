"""The few points where user code joins the loop. Subclass `Callback` and override what you need.

    on_fit_start(trainer)              after resuming, before the first batch
    on_batch_end(trainer, metrics)     after each optimizer step (and the timestamp update); `metrics`
                                       holds this batch's logged values (none on batches not logged)
                                       and always "step_time", the step's seconds on the host clock
    on_eval_end(trainer, metrics)      after each evaluation, with its metrics ("eval/loss", ...)
    on_checkpoint_saved(trainer, info) when a checkpoint is committed (rank 0) or this rank's part is
                                       uploaded; runs on the background save thread (`CheckpointInfo`)
    on_fit_end(trainer)                after the last batch and the final save

Every rank runs the callbacks. Set `trainer.stop_requested = True` to end the run after the current
batch (with a final save when checkpointing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from tessera.train.checkpoint.layout import CheckpointInfo
    from tessera.train.time import Timestamp


class TrainerView(Protocol):
    """What a callback sees of the `Trainer` that calls it (the Trainer satisfies this).

    Callbacks are typed against this rather than the Trainer class so that this module never imports
    trainer.py, which imports this one: the loop depends on its hooks, not the other way round.
    """

    stop_requested: bool  # set True to end the run after the current batch

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]: ...

    @property
    def timestamp(self) -> Timestamp: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def run_name(self) -> str: ...


class Callback:
    def on_fit_start(self, trainer: TrainerView) -> None:
        pass

    def on_batch_end(self, trainer: TrainerView, metrics: dict[str, Any]) -> None:
        pass

    def on_eval_end(self, trainer: TrainerView, metrics: dict[str, Any]) -> None:
        pass

    def on_checkpoint_saved(self, trainer: TrainerView, info: CheckpointInfo) -> None:
        pass

    def on_fit_end(self, trainer: TrainerView) -> None:
        pass
