"""The few points where user code joins the loop. Subclass `Callback` and override what you need.

    on_fit_start(trainer)              after resuming, before the first batch
    on_batch_end(trainer, metrics)     after each optimizer step (and the timestamp update); `metrics`
                                       holds this batch's logged values ({} on batches not logged)
    on_eval_end(trainer, metrics)      after each evaluation, with its metrics ("eval/loss", ...)
    on_checkpoint_saved(trainer, info) when a checkpoint is committed (rank 0) or this rank's part is
                                       uploaded; runs on the background save thread (`CheckpointInfo`)
    on_fit_end(trainer)                after the last batch and the final save

Every rank runs the callbacks. Set `trainer.stop_requested = True` to end the run after the current
batch (with a final save when checkpointing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tessera.train.checkpoint import CheckpointInfo
    from tessera.train.trainer import Trainer


class Callback:
    def on_fit_start(self, trainer: Trainer) -> None:
        pass

    def on_batch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        pass

    def on_eval_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        pass

    def on_checkpoint_saved(self, trainer: Trainer, info: CheckpointInfo) -> None:
        pass

    def on_fit_end(self, trainer: Trainer) -> None:
        pass
