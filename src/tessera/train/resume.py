"""Where `Trainer.fit` starts from: autoresume's newest checkpoint, else `load_path` (the full state, or
the weights only), applied to the run, with a warning when the resumed run cannot continue exactly where
the saved one stopped. Finding, verifying and loading the checkpoint is `tessera.train.checkpoint`'s.

Autoresume continues only a run of the same name: a save folder whose newest checkpoint another run
name wrote (two runs given one fixed save_folder) is refused before anything loads, unless `load_path`
says where to start (`ForeignCheckpoint`). Runs without a name on either side are not compared.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from typing import Any

import torch

from tessera.storage import StorageError, Store, open_store
from tessera.train.checkpoint import CheckpointManager, apply_state
from tessera.train.checkpoint.layout import META, resume_order
from tessera.train.config import TrainerConfig
from tessera.train.cpu_threads import resume_threads
from tessera.train.time import Timestamp


class ForeignCheckpoint(ValueError):
    """The save folder's newest checkpoint belongs to a run of another name; autoresume would continue it."""


def saved_run(store: Store, names: list[str] | None = None) -> tuple[str, str] | None:
    """(run name, checkpoint name) from the meta.json of the checkpoint autoresume would try first (the
    first one with a readable meta.json), or None when the folder has none or it names no run. `names`:
    the folder's `resume_order`, when the caller has it."""
    for name in resume_order(store, lambda _: None)[0] if names is None else names:  # latest() warns
        try:
            meta = json.loads(store.get(f"{name}/{META}"))
        except (StorageError, ValueError):
            continue
        config = meta.get("config") if isinstance(meta, dict) else None
        run = config.get("run_name") if isinstance(config, dict) else None
        return (run, name) if isinstance(run, str) and run else None
    return None


def foreign_checkpoints(manager: CheckpointManager, run_name: str) -> str | None:
    """Why autoresume may not continue the folder's checkpoints (another run name wrote the newest), in
    one line that says what to do; None when they are this run's, unnamed, or absent, or this run has no
    name."""
    found = saved_run(manager.store) if run_name else None
    if found is None or found[0] == run_name:
        return None
    folder = manager.save_folder.rstrip("/")
    return (f"{folder} holds checkpoints of run '{found[0]}', this run is '{run_name}': give "
            f"load_path={folder}/{found[1]} to start from it, or another save_folder")


def resumes_own_checkpoint(config: TrainerConfig) -> bool:
    """Whether a Trainer of `config` will autoresume from its save folder (a committed checkpoint there, not
    another run's), so that its `load_path` goes unused: a caller that prepares load_path first (converts
    it, downloads it) asks this. False when the folder cannot be read: the Trainer then says why."""
    if not config.autoresume or config.save_folder is None:
        return False
    run_name = config.run_name or os.environ.get("RUN_NAME", "")
    try:
        store = open_store(config.save_folder.replace("{run_name}", run_name))
        names, committed = resume_order(store, lambda _: None)
        found = saved_run(store, names) if committed and run_name else None
    except StorageError:
        return False
    return committed and (found is None or found[0] == run_name)


def resume(trainer: Any, log: logging.Logger) -> None:
    """Load the checkpoint `trainer` resumes from, if any, into its model, optimizers, schedulers, scaler,
    timestamp and train dataloader; `trainer.resumed` then names it. `log` is the trainer's logger."""
    state = None
    if trainer.autoresume and trainer.checkpoints is not None:
        refusal = foreign_checkpoints(trainer.checkpoints, trainer.run_name)
        if refusal is None:
            state = trainer.checkpoints.latest(model=trainer.model, optimizers=trainer.optimizers)
        elif trainer.load_path is None:
            raise ForeignCheckpoint(refusal)
        else:
            log.info("not resuming another run's checkpoints in %s: starting from load_path",
                     trainer.checkpoints.save_folder)
    if state is None and trainer.load_path is not None:
        manager = trainer.checkpoints or CheckpointManager(trainer.load_path)
        try:
            state = manager.load(trainer.load_path, model=trainer.model, optimizers=trainer.optimizers,
                                 weights_only=trainer.load_weights_only)
        finally:
            if manager is not trainer.checkpoints:
                manager.close()
    if state is None:
        return
    where = state.get("checkpoint", {}).get("url", trainer.load_path)
    trainer.resumed = {"url": where, "config": state.get("config") or {}}  # what callbacks may check
    if "schedulers" not in state:  # a weights-only load
        apply_state(state, trainer.model, restore_rng=False)
        log.info("loaded weights from %s", where)
        return
    scaler = trainer.scaler if trainer.scaler.is_enabled() else None
    apply_state(state, trainer.model, trainer.optimizers, trainer.schedulers, scaler, restore_rng=False)
    trainer.timestamp = Timestamp.from_state_dict(state["timestamp"])
    trainer._pending_rng = state.get("rng")
    saved_config = state.get("config") or {}
    found = saved_config.get("auto_microbatch_size")
    if trainer.microbatch.auto and found:  # the size auto-microbatching had found: the same cuts, the same sums
        trainer.microbatch.size = int(found)
    resume_threads(trainer.device, saved_config.get("cpu_threads"), trainer.settings.torch_threads is not None)
    trainer.cpu_threads = torch.get_num_threads() if trainer.device.type == "cpu" else trainer.cpu_threads
    # stacklevel 4: the warnings name the caller of Trainer.fit (resume <- Trainer._resume <- fit <- caller)
    if state.get("dataloader") is not None and hasattr(trainer.train_dataloader, "load_state_dict"):
        trainer.train_dataloader.load_state_dict(state["dataloader"])
    elif trainer.timestamp.batch_in_epoch:
        warnings.warn("train_dataloader has no load_state_dict(): the resumed run restarts the epoch from its "
                      "first batch (use tessera.stream.StreamingDataLoader to continue where it stopped)",
                      stacklevel=4)
    saved = state.get("config", {}).get("global_batch_size")
    now = (trainer.per_device_batch_size or 0) * trainer.world_size
    if saved and now and saved != now:
        warnings.warn(f"{where} was trained with a global batch of {saved}, this run has {now}: the data order "
                      f"and the loss curve will differ from an uninterrupted run", stacklevel=4)
    log.info("resumed from %s at %s", where, trainer.timestamp)
