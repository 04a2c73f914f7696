"""`ICLEvaluator`: ICL tasks scored during training, at the run's `eval_interval` and at its end.

A trainer callback (train/callbacks.py), so the train layer never learns about language models: it
decides on its own when the interval fires (the trainer's data eval need not exist), scores on every
rank (runner.py shares the items and sums the counts), and hands the same numbers to every logger on
rank 0 at the current batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tessera.llm.icl.config import GauntletConfig, ICLSection
from tessera.llm.icl.runner import PreparedTask, evaluate_icl, prepare_tasks
from tessera.storage import StorageError
from tessera.train.callbacks import Callback, TrainerView
from tessera.train.checkpoint import unwrap_model
from tessera.train.time import Time, Timestamp, interval_fires


class ICLEvaluator(Callback):
    """Scores `tasks` every `interval` of training and once more at the end of the run (unless it was
    asked to stop). Intervals count as the trainer's do; a `dur` interval needs a max_duration not in
    epochs, since a callback is not told the epoch length."""

    def __init__(self, tasks: Sequence[PreparedTask], tokenizer: Any, interval: Time | str, *,
                 subset_num_batches: int | None = None, gauntlet: GauntletConfig | None = None,
                 max_duration: Time | str | None = None) -> None:
        self.tasks, self.tokenizer = list(tasks), tokenizer
        self.interval = Time.parse(interval)
        self.subset_num_batches, self.gauntlet, self.max_duration = subset_num_batches, gauntlet, max_duration
        self._before: Timestamp | None = None
        self._last: Timestamp | None = None
        self.history: list[tuple[int, dict[str, float]]] = []  # (batch, metrics) of each evaluation

    def on_fit_start(self, trainer: TrainerView) -> None:
        self._before = trainer.timestamp
        self._last = trainer.timestamp  # a resumed run does not score the weights it starts from again

    def on_batch_end(self, trainer: TrainerView, metrics: dict[str, Any]) -> None:
        before, now = self._before or trainer.timestamp, trainer.timestamp
        self._before = now
        if interval_fires(self.interval, before, now, max_duration=self.max_duration):
            self.evaluate(trainer)

    def on_fit_end(self, trainer: TrainerView) -> None:
        # A requested stop (SIGTERM: preemption, a move) ends as soon as the checkpoint is saved.
        if self._last != trainer.timestamp and not trainer.stop_requested:
            self.evaluate(trainer)

    def evaluate(self, trainer: TrainerView) -> dict[str, float]:
        """Score every task now, log the metrics on rank 0, and return them (on every rank)."""
        sharded = getattr(trainer, "parallelism", None) == "fsdp"
        model = trainer.model if sharded else unwrap_model(trainer.model)  # no DDP hooks in eval
        device = getattr(trainer, "device", None)
        # The ranks of a tensor-parallel group (consecutive ranks) hold one model: they score the same items.
        tp = getattr(getattr(trainer, "plan", None), "tp_degree", 1) or 1
        started = time.perf_counter()
        metrics = evaluate_icl(self.tasks, model, self.tokenizer, device=device, rank=trainer.rank // tp,
                               world_size=trainer.world_size // tp, subset_num_batches=self.subset_num_batches,
                               gauntlet=self.gauntlet, replicas=tp)
        metrics["icl/seconds"] = time.perf_counter() - started
        self._last = trainer.timestamp
        self.history.append((trainer.timestamp.batch, metrics))
        if trainer.rank == 0:
            for logger in getattr(trainer, "loggers", ()):
                logger.log_metrics(metrics, trainer.timestamp.batch)
        throughput = getattr(trainer, "throughput", None)
        if throughput is not None:  # scoring time is not training time
            throughput.start(trainer.timestamp.sample, trainer.timestamp.token)
        return metrics


def icl_evaluator(section: ICLSection, tokenizer: Any, max_seq_len: int, interval: Time | str | None,
                  max_duration: Time | str | None = None) -> ICLEvaluator | None:
    """The callback a recipe's ICL keys ask for (None without `icl_tasks`), its task files read and
    tokenized now, so a missing file fails before training starts; ICLTaskError names the task's key."""
    if not section.icl_tasks:
        return None
    tasks = []
    for i, cfg in enumerate(section.icl_tasks):
        try:
            tasks += prepare_tasks([cfg], tokenizer, max_seq_len)
        except (OSError, ValueError, StorageError) as exc:
            raise ICLTaskError(f"icl_tasks.{i}.dataset_uri ({cfg.label}): {exc}") from None
    return ICLEvaluator(tasks, tokenizer, interval or "1ep", subset_num_batches=section.icl_subset_num_batches,
                        gauntlet=section.eval_gauntlet, max_duration=max_duration)


class ICLTaskError(ValueError):
    """An ICL task that cannot be prepared (its file is missing or malformed); the message names the key."""
