"""Checks of the Trainer's settings, run before anything starts, with messages that say what to change."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Any

from tessera.storage import StorageError, open_store
from tessera.train.time import Time, TimeUnit


class Precision(StrEnum):
    """`fp32`, or autocast to bfloat16 / float16 (float16 adds a gradient scaler)."""

    FP32 = "fp32"
    AMP_BF16 = "amp_bf16"
    AMP_FP16 = "amp_fp16"


def parse_precision(precision: str) -> Precision:
    try:
        return Precision(precision)
    except ValueError:
        raise ValueError(f"unknown precision {precision!r}; use one of {[p.value for p in Precision]}") from None


def parse_time(value: Time | str, name: str, *, allow_dur: bool = True) -> Time:
    """`Time.parse` with the setting's name in the error."""
    try:
        time = Time.parse(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name}: {exc}") from None
    if not allow_dur and time.unit is TimeUnit.DURATION:
        raise ValueError(f"{name} must be in ba, ep, sp or tok, not {time}")
    return time


def parse_microbatch(value: int | str | None) -> tuple[int | None, bool]:
    """(fixed microbatch size or None, auto?) from device_train_microbatch_size."""
    if value == "auto":
        return None, True
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value, False
    raise ValueError(f"device_train_microbatch_size must be a positive int, 'auto' or None, got {value!r}")


def per_device_batch_size(loader: Any, global_batch_size: int | None, world_size: int) -> int | None:
    """The per-device batch the global batch implies, checked against the loader's (if it tells)."""
    per_device = getattr(loader, "batch_size", None)
    if global_batch_size is None:
        return per_device
    if global_batch_size % world_size:
        raise ValueError(f"global_batch_size={global_batch_size} is not divisible by the world size {world_size}; "
                         f"use a multiple of {world_size} or another number of ranks")
    wanted = global_batch_size // world_size
    if per_device is not None and per_device != wanted:
        raise ValueError(f"global_batch_size={global_batch_size} over {world_size} rank(s) needs a per-device "
                         f"batch of {wanted}, but train_dataloader yields {per_device}; set its batch_size to "
                         f"{wanted}")
    return wanted


def check_batch_size(got: int, expected: int | None) -> int:
    """The per-device batch size, checked on the first batch of each epoch."""
    if expected is not None and got != expected:
        raise ValueError(f"train_dataloader yields batches of {got}, but the global batch needs {expected} per "
                         f"device; set the loader's batch_size to {expected}")
    return got


def check_run_name(run_name: str) -> str:
    """A run name becomes a folder name (checkpoints, logs), so it may not climb out of its parent."""
    if not run_name or "/" in run_name or "\\" in run_name or ".." in run_name or run_name.startswith("."):
        raise ValueError(f"run_name {run_name!r} is refused: it names a folder, so it must be non-empty and "
                         "'/', '\\', '..' and a leading '.' (path traversal) are not allowed")
    return run_name


def check_save_folder(save_folder: str, run_name: str | None, rank: int) -> None:
    """Write and delete a small object in the save folder, so a typo or missing permission fails now."""
    run_name = run_name or os.environ.get("RUN_NAME", "")
    if run_name:
        check_run_name(run_name)
    if "{run_name}" in save_folder and not run_name:
        raise ValueError(f"save_folder {save_folder!r} contains {{run_name}}: pass run_name= or set RUN_NAME")
    folder = save_folder.replace("{run_name}", run_name)
    probe = f".tessera-write-check-{rank}"
    try:
        store = open_store(folder)
        store.put(probe, b"ok")
        store.delete(probe)
    except (StorageError, OSError, ValueError) as exc:
        raise ValueError(f"save_folder {folder!r} cannot be written ({exc}); check the bucket name, the "
                         f"credentials (S3_ENDPOINT_URL, AWS_*) and write permission, or pick another folder"
                         ) from None
