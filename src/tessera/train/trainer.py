"""`Trainer`: one readable training loop; checkpoints, logging, evaluation and set-up are calls into the
modules that own them (checkpoint, resume, loggers, metrics, microbatch, optimizer_step, distributed,
heartbeat, nonfinite).

    trainer = Trainer(model=model, optimizers=opt, train_dataloader=loader, max_duration="2ep",
                      save_folder="s3://bucket/runs/{run_name}/checkpoints", save_interval="500ba",
                      autoresume=True, precision="amp_bf16", device_train_microbatch_size="auto")
    trainer.fit()

The model contract: `model(batch)` returns the loss, a scalar tensor averaged over the samples of
`batch`, or a dict with a "loss" entry (other scalar entries are reported as eval metrics). Or pass
`loss_fn(model, batch)` returning the same. `batch` is what the dataloader yields, moved to the device
and cut into microbatches along dim 0 (see `microbatch.split_batch`). A model may expose
`flops_per_token` (training FLOPs per token) for MFU.

One step: the per-device batch is split into microbatches; each runs forward under autocast and
backward on its loss scaled by its share of the batch (DDP/FSDP sync only on the last); gradients are
clipped; the optimizers and schedulers step; the timestamp advances by the global samples and tokens;
then logging, evaluation and checkpointing run if their interval fires. The global batch is
`global_batch_size` (default: the per-device batch x world size); it must equal the loader's batch x
world size, which is what makes elastic resume (same global batch, other world size) continue the same
global order: see docs/training.md.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tessera.train import distributed as dist_utils
from tessera.train.callbacks import Callback
from tessera.train.checkpoint import CheckpointInfo, CheckpointManager, capture_state, unwrap_model
from tessera.train.config import (
    Precision,
    TrainerConfig,
    check_batch_size,
    check_save_folder,
    parse_microbatch,
    per_device_batch_size,
)
from tessera.train.cpu_threads import choose_threads
from tessera.train.epochs import END, EpochIterator, loader_length
from tessera.train.evaluation import evaluate, model_outputs
from tessera.train.hardware import device_peak_flops
from tessera.train.heartbeat import Heartbeat
from tessera.train.loggers import RunInfo, make_loggers
from tessera.train.microbatch import AutoMicrobatch, batch_size_of, count_tokens, forward_backward, move_to
from tessera.train.nonfinite import NonFiniteGuard
from tessera.train.optimizer_step import clip_gradients, step_optimizers
from tessera.train.parallel import parallelize, resolve_plan
from tessera.train.resume import resume
from tessera.train.schedule import lambda_lr
from tessera.train.throughput import Throughput, flops_per_token
from tessera.train.time import Time, Timestamp, TimeUnit, interval_fires, run_progress

log = logging.getLogger(__name__)


def seed_all(seed: int) -> None:
    """Seed python's `random`, numpy's global generator and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _listify(value: Any) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


class Trainer:
    """Trains `model` with `optimizers` on `train_dataloader` for `max_duration` (module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
                 *, train_dataloader: Any, schedulers: Any = None, eval_dataloader: Any = None,
                 callbacks: Sequence[Callback] = (), loss_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
                 num_tokens_fn: Callable[[Any], int] | None = None, run_config: dict[str, Any] | None = None,
                 config: TrainerConfig | None = None, **settings: Any) -> None:
        """`settings` are `TrainerConfig`'s fields as keywords (max_duration="2ep", save_folder=...), or pass
        a built `config=`; the objects the run uses (model, loaders, callbacks...) are the named arguments."""
        # Configuration errors first, before any process group, download or upload.
        if config is not None and settings:
            raise TypeError(f"pass the settings as keywords or as config=, not both (got {sorted(settings)})")
        cfg = self.settings = config if config is not None else TrainerConfig.of(settings)
        self.run_config = dict(run_config or {})  # e.g. the recipe: stored in every checkpoint's meta.json
        self.precision, self.max_duration, self.log_interval = cfg.precision, cfg.max_duration, cfg.log_interval
        self.save_interval = cfg.save_interval or Time(1, TimeUnit.EPOCH)
        self.eval_interval = cfg.eval_interval or Time(1, TimeUnit.EPOCH)
        microbatch_size, auto = parse_microbatch(cfg.device_train_microbatch_size)
        run_name, save_folder = cfg.run_name, cfg.save_folder

        self.env = dist_utils.current_env()
        self.rank, self.world_size = self.env.rank, self.env.world_size
        self.device = torch.device(cfg.device) if cfg.device is not None else dist_utils.default_device(self.env)
        # ranks of one tensor-parallel group see the same batch: the global batch counts data-parallel ranks
        self.plan = resolve_plan(cfg.parallelism, self.world_size, self.env.local_world_size, self.device.type,
                                 self.precision.value)
        self.per_device_batch_size = per_device_batch_size(train_dataloader, cfg.global_batch_size, self.plan.dp_degree)
        self.loggers = make_loggers(cfg.loggers)  # an unavailable logger (tensorboard) fails here
        if save_folder is not None:
            check_save_folder(save_folder, run_name, self.rank)
        dist_utils.init_distributed(self.device)
        self.cpu_threads = choose_threads(self.device, cfg.torch_threads)  # saved: a resumed run takes it again
        self.microbatch = AutoMicrobatch(microbatch_size, auto, self.device)
        seed_all(cfg.seed + self.rank)

        self.optimizers = _listify(optimizers)
        self.model = parallelize(model, self.plan, self.device, self.optimizers)
        self.timestamp = Timestamp()
        self.schedulers: list[Any] = []
        for sched in _listify(schedulers):
            if hasattr(sched, "step"):
                self.schedulers.append(sched)
            else:  # a tessera.train.schedule schedule: one LambdaLR per optimizer, reading the live timestamp
                resolved = sched.resolve(self.max_duration, batches_per_epoch=loader_length(train_dataloader))
                self.schedulers += [lambda_lr(opt, resolved, lambda: self.timestamp) for opt in self.optimizers]
        self._amp_dtype = {Precision.AMP_BF16: torch.bfloat16, Precision.AMP_FP16: torch.float16}.get(self.precision)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision is Precision.AMP_FP16)
        self._manual_sync = auto and self.world_size > 1 and self.plan.data_parallel == "ddp"
        self._count_group = torch.distributed.new_group(backend="gloo") if self.world_size > 1 else None

        self.train_dataloader, self.eval_dataloader = train_dataloader, eval_dataloader
        self.eval_subset_num_batches = cfg.eval_subset_num_batches
        self.loss_fn, self.num_tokens_fn = loss_fn, num_tokens_fn
        self.grad_clip_norm, self.seed = cfg.grad_clip_norm, cfg.seed
        declared = cfg.parallelism.data_parallel  # "ddp", "fsdp" or None, as configured (checkpoint meta, eval)
        self.parallelism = None if declared == "none" else declared
        self.autoresume, self.load_path, self.load_weights_only = cfg.autoresume, cfg.load_path, cfg.load_weights_only
        self.callbacks = list(callbacks)
        self.checkpoints: CheckpointManager | None = None
        if save_folder is not None:
            self.checkpoints = CheckpointManager(save_folder, run_name, num_to_keep=cfg.save_num_checkpoints_to_keep,
                                                 keep_every_n=cfg.save_keep_every_n, on_saved=self._on_saved)
        self.run_name = self.checkpoints.run_name if self.checkpoints else (run_name or os.environ.get("RUN_NAME", ""))
        self.log_dir = Path(cfg.log_dir.replace("{run_name}", self.run_name or "run"))
        self.heartbeat = Heartbeat.from_env(self.run_name, self.rank)
        self.throughput = Throughput(device=self.device)
        self.summary: dict[str, float] = {}  # the run's throughput figures, set when fit() ends
        self.stop_requested = False  # agreed by every rank (set by callbacks, or from request_stop)
        self._stop_pending = False  # request_stop() on this rank, not yet agreed
        self._pending_rng: dict[str, Any] | None = None
        self.resumed: dict[str, Any] | None = None  # the loaded checkpoint's URL and config, after fit() resumed
        self.nonfinite = NonFiniteGuard(cfg.on_nonfinite, cfg.max_skipped_steps, self.device, self.scaler)
        self._last_eval: Timestamp | None = None
        self._flops_per_token = flops_per_token(self.model)
        self._peak_flops = device_peak_flops(self.device, self.precision.value)

    # --- the loop ----------------------------------------------------------------------------------------

    def fit(self) -> None:
        """Train until `max_duration` (or `stop_requested`), resuming first if asked to."""
        self._resume()
        self._start()
        started_at = self.timestamp
        self.nonfinite.finite_until = started_at.batch
        batches = EpochIterator(self.train_dataloader, self.timestamp.batch_in_epoch, self._pending_rng)
        try:
            while not self._finished():
                t0 = time.perf_counter()
                self.throughput.begin_step(t0)
                batch = batches.next_batch()
                data_wait = time.perf_counter() - t0
                before = self.timestamp
                if batch is END:  # the loader is exhausted: the epoch is over
                    if before.batch_in_epoch == 0:
                        raise RuntimeError(f"train_dataloader yielded no batches in epoch {before.epoch}")
                    self.timestamp = before.to_next_epoch()
                    batches.open()
                    self._after_step(before)
                    continue
                if before.batch_in_epoch == 0:
                    self.per_device_batch_size = check_batch_size(batch_size_of(batch), self.per_device_batch_size)
                batch = move_to(batch, self.device)
                self.throughput.start_phases()                  # CUDA events on a GPU: no sync
                loss = self._train_batch(batch)                   # forward + backward over microbatches
                self.throughput.mark("forward_backward")
                grad_norm = clip_gradients(self.model, self.optimizers, self.scaler, self.grad_clip_norm,
                                           self.nonfinite.skipping)
                skip = self.nonfinite.note(loss, grad_norm)     # None unless on_nonfinite="skip"
                step_optimizers(self.optimizers, self.scaler, self.nonfinite, skip)
                self.throughput.mark("optimizer")
                self.timestamp = before.to_next_batch(*self._global_counts(batch))
                for sched in self.schedulers:
                    sched.step()
                if batches.epoch_done(self.timestamp.batch_in_epoch):  # a checkpoint now is an epoch end
                    self.timestamp = self.timestamp.to_next_epoch()
                    batches.open()
                step_time = self.throughput.update(self.timestamp.sample, self.timestamp.token, data_wait)
                # the loss stays on the device except at log points; step_time is the host clock's
                metrics = {**self._log_batch(before, loss, grad_norm, batches.length), "step_time": step_time}
                for callback in self.callbacks:
                    callback.on_batch_end(self, metrics)
                self._after_step(before, batches.length)           # eval, checkpoint, heartbeat
        except BaseException:
            if self.heartbeat:
                self.heartbeat.beat(self.timestamp, status="failed", force=True)
            raise
        self._finish(started_at)

    def _train_batch(self, batch: Any) -> torch.Tensor:
        """Forward and backward over the microbatches of one per-device batch; the batch's mean loss
        (microbatch.forward_backward: with auto-microbatching, an out-of-memory error reruns the batch)."""
        return forward_backward(batch, self.microbatch, self.model, self._forward,
                                lambda loss: self.scaler.scale(loss).backward(), manual_sync=self._manual_sync,
                                on_retry=self._drop_gradients)

    def _forward(self, microbatch: Any) -> torch.Tensor:
        with self._autocast():
            return model_outputs(self.model, microbatch, self.loss_fn)["loss"]

    def _drop_gradients(self) -> None:
        log.warning("out of memory in a microbatch; retrying the batch with microbatches of %d",
                    self.microbatch.size)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=self._amp_dtype, enabled=self._amp_dtype is not None)

    def request_stop(self) -> None:
        """Checkpoint and end the run after the current step (what SIGTERM and Ctrl-C ask: safe in a signal
        handler). A signal reaches the ranks at different moments, so a rank only notes it here; the ranks
        agree with the step's sample counts (`_global_counts`) and all stop after the same step."""
        self._stop_pending = True

    def _global_counts(self, batch: Any) -> tuple[int, int]:
        """The step's samples and tokens over all ranks; settles a pending `request_stop` on every rank."""
        tokens = self.num_tokens_fn(batch) if self.num_tokens_fn is not None else count_tokens(batch)
        stop = self._stop_pending  # read once: a signal may set it again at any bytecode
        samples, tokens, stop = dist_utils.step_counts(batch_size_of(batch), int(tokens), stop, self._count_group,
                                                       self.plan.tp_degree)
        self.stop_requested = self.stop_requested or stop
        return samples, tokens

    def _finished(self) -> bool:
        return self.stop_requested or self.timestamp.get(self.max_duration.unit) >= self.max_duration

    def _after_step(self, before: Timestamp, epoch_length: int | None = None) -> None:
        if self.eval_dataloader is not None and self._fires(self.eval_interval, before, epoch_length):
            self.evaluate()
        if self.checkpoints is not None and self._fires(self.save_interval, before, epoch_length):
            self._check_finite(weights=True)
            self.save_checkpoint()
        if self.heartbeat:
            self.heartbeat.beat(self.timestamp)

    def _check_finite(self, weights: bool = False) -> None:
        """NonFiniteGuard.check at this batch; `weights`: the model's parameters too (before a save)."""
        self.nonfinite.check(self.timestamp.batch, self.optimizers, self.model.parameters() if weights else ())

    def _fires(self, interval: Time, before: Timestamp, epoch_length: int | None) -> bool:
        """`dur` intervals of an `ep` max_duration need the epoch length; `ep` intervals count epochs."""
        return interval_fires(interval, before, self.timestamp, max_duration=self.max_duration,
                              batches_per_epoch=epoch_length if interval.unit is TimeUnit.DURATION else None)

    # --- evaluation ------------------------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Mean loss (and other scalars the model returns) over the eval dataloader, over all ranks."""
        model = self.model if self.parallelism == "fsdp" else unwrap_model(self.model)  # no DDP hooks in eval
        metrics = evaluate(model, self.eval_dataloader, self.device, loss_fn=self.loss_fn, autocast=self._autocast,
                           max_batches=self.eval_subset_num_batches)
        self._last_eval = self.timestamp
        self._log(metrics)
        for callback in self.callbacks:
            callback.on_eval_end(self, metrics)
        self.throughput.start(self.timestamp.sample, self.timestamp.token)  # eval time is not training time
        return metrics

    # --- checkpoints ----------------------------------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """The run settings stored in each checkpoint's meta.json."""
        return {"run_name": self.run_name, "max_duration": str(self.max_duration), "world_size": self.world_size,
                "global_batch_size": (self.per_device_batch_size or 0) * self.world_size,
                "precision": self.precision.value, "parallelism": self.parallelism, "seed": self.seed,
                "grad_clip_norm": self.grad_clip_norm,
                **({"auto_microbatch_size": self.microbatch.size} if self.microbatch.auto else {}),
                **({"cpu_threads": self.cpu_threads} if self.device.type == "cpu" else {}), **self.run_config}

    def save_checkpoint(self) -> None:
        """Stage the run's state and save it in the background (every rank calls this at the same step)."""
        assert self.checkpoints is not None
        start = time.perf_counter()
        loader_state = self.train_dataloader.state_dict() if hasattr(self.train_dataloader, "state_dict") else None
        state = capture_state(self.model, self.optimizers, self.schedulers,
                              self.scaler if self.scaler.is_enabled() else None, timestamp=self.timestamp,
                              dataloader=loader_state, config=self.config)
        self.checkpoints.save(state, self.timestamp)
        self._log({"checkpoint/stall_sec": time.perf_counter() - start})

    def _on_saved(self, info: CheckpointInfo) -> None:  # on the save thread
        if self.heartbeat and info.committed:
            self.heartbeat.event("checkpoint", name=info.name, url=info.url, step=info.timestamp.batch,
                                 bytes=info.bytes, stall_seconds=info.stall_seconds)
        if self.rank == 0:
            for logger in self.loggers:
                logger.flush()
        for callback in self.callbacks:
            callback.on_checkpoint_saved(self, info)

    def _resume(self) -> None:
        resume(self, log)  # resume.py: autoresume's newest checkpoint, else load_path

    # --- start, log, finish --------------------------------------------------------------------------------

    def _start(self) -> None:
        if self.rank == 0:
            remote = self.checkpoints.store.child("logs") if self.checkpoints is not None else None
            for logger in self.loggers:
                logger.start(RunInfo(self.run_name, self.config, self.log_dir, remote,
                                     start_progress=run_progress(self.timestamp, self.max_duration,
                                                               loader_length(self.train_dataloader))))
        if self.heartbeat:
            self.heartbeat.event("fit_start", step=self.timestamp.batch)
            self.heartbeat.beat(self.timestamp, force=True)
        self.model.train()
        self.throughput.start(self.timestamp.sample, self.timestamp.token)
        for callback in self.callbacks:
            callback.on_fit_start(self)

    def _log_batch(self, before: Timestamp, loss: torch.Tensor, grad_norm: torch.Tensor | None,
                   epoch_length: int | None) -> dict[str, float]:
        if not interval_fires(self.log_interval, before, self.timestamp):
            return {}
        skipping = self.nonfinite.skipping
        values = torch.stack([loss.float()] + ([grad_norm.float().to(loss.device)] if grad_norm is not None else [])
                             + ([self.nonfinite.skipped.float()] if skipping else []))
        values = dist_utils.all_reduce_(values, "mean").tolist()  # grad norms, skip counts: equal on every rank
        self._check_finite()  # the values just synchronised: no extra wait
        ts = self.timestamp
        metrics = {"train/loss": values[0], "time/epoch": ts.epoch, "time/sample": ts.sample,
                   "time/token": ts.token, "time/progress": run_progress(ts, self.max_duration, epoch_length),
                   "train/microbatch_size": self.microbatch.current or 0}
        if grad_norm is not None:
            metrics["train/grad_norm"] = values[1]
        if skipping:
            metrics["train/skipped_steps"] = round(values[-1])
        for i, opt in enumerate(self.optimizers):
            metrics[f"lr/opt{i}"] = opt.param_groups[0]["lr"]
        metrics.update(self.throughput.metrics(self.world_size, self._flops_per_token, self._peak_flops))
        self._log(metrics)
        return metrics

    def _log(self, metrics: dict[str, float]) -> None:
        if self.rank == 0 and metrics:
            for logger in self.loggers:
                logger.log_metrics(metrics, self.timestamp.batch)

    def _finish(self, started_at: Timestamp) -> None:
        trained = self.timestamp != started_at  # False when resuming a run that had already finished
        self.summary = self.throughput.summary(self.world_size, self.timestamp.sample, self.timestamp.token,
                                               self._flops_per_token, self._peak_flops)
        self._log(self.summary)  # before the final eval and save, which are not training time
        # A requested stop (SIGTERM, Ctrl-C) saves at once: the final evaluation is the finished run's.
        if trained and self.eval_dataloader is not None and self._last_eval != self.timestamp \
                and not self.stop_requested:
            self.evaluate()
        if trained and self.checkpoints is not None:
            self._check_finite(weights=True)
            self.save_checkpoint()
        elif trained and self.nonfinite.skipping:
            self._check_finite()  # too many skipped steps since the last log line also fail the run
        if self.checkpoints is not None:
            self.checkpoints.wait()
        for callback in self.callbacks:
            callback.on_fit_end(self)
        if self.heartbeat:
            self.heartbeat.event("fit_end", step=self.timestamp.batch)
            self.heartbeat.beat(self.timestamp, status="finished", force=True)
        if self.rank == 0:
            for logger in self.loggers:
                logger.close()

    def close(self) -> None:
        """Leave in one order, whether the run finished, stopped or failed: the save in flight finishes and
        the checkpoint thread is joined (and the manager leaves its gloo group), the heartbeat sends what it
        queued, then the count group goes. Each group is destroyed and released here, so its threads are
        joined now rather than by destructors at interpreter exit, where a group torn down late can abort a
        rank that had finished. The default group is the caller's to destroy (`distributed.destroy`), once
        the model that uses it is released. Idempotent."""
        try:
            if self.checkpoints is not None:
                self.checkpoints.close()
        finally:
            if self.heartbeat:
                self.heartbeat.close()
            group, self._count_group = self._count_group, None
            dist_utils.destroy_group(group)
