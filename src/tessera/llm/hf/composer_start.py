"""A run Composer started, continued by Tessera: its checkpoint as a Tessera checkpoint, once per node.

    start = composer_load_path("s3://bucket/foundry-run/checkpoints/ep0-ba100-rank0.pt")
    start.url            # a Tessera checkpoint: the Trainer resumes from it as from its own checkpoints
    start.weights_only   # None, or why only the weights carry over (then load it weights-only)
    config = composer_trainer_config(recipe.trainer_config())   # what `tessera train` does with load_path

The Trainer loads `load_path` with Tessera's checkpoint machinery (train/checkpoint: verified files, the
model, the optimizer, the timestamp, the RNG, a warning when the global batch differs), so a Composer
checkpoint is written once in that layout (`ComposerCheckpoint.state()`, hf/composer.py) and then
resumed like any other. It goes into the model cache (`$TESSERA_MODEL_CACHE`, hf/cache.py) under a name
that hashes the source's URL, size and modification time or ETag: an unchanged source is converted once,
a changed one again. The local ranks of a node share it: the first to take the lock converts into a
temporary folder and renames it into place, the others wait and find it done. Call it before the process
group starts (a run's ranks each call it, as they each build their model).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.llm.hf.cache import default_cache_dir
from tessera.llm.hf.composer import ComposerCheckpointError, checkpoint_version, read_composer_checkpoint
from tessera.llm.model_source import (
    is_checkpoint_file,
    is_sharded_composer,
    sharded_composer_message,
)
from tessera.storage.locks import filled_once
from tessera.train.checkpoint import CheckpointManager
from tessera.train.config import TrainerConfig
from tessera.train.resume import resumes_own_checkpoint

SUMMARY = "composer-start.json"  # beside the checkpoint: its model config and what carried over
_NOT_COMPARED = ("dropout", "init_std")  # settings that leave the weights' meaning alone


@dataclass(frozen=True)
class ComposerStart:
    url: str                     # a Tessera checkpoint root: give it as load_path
    weights_only: str | None     # why only the weights carry over (then set load_weights_only); None: all of it
    model: dict[str, Any]        # the GPTConfig the checkpoint's MPT maps to


def composer_load_path(url: str, cache_dir: str | os.PathLike[str] | None = None,
                       mpt_config: Mapping[str, Any] | None = None) -> ComposerStart:
    """The Composer checkpoint at `url` as a Tessera checkpoint (module docstring). `mpt_config`: the MPT
    config when the checkpoint has none (a Foundry YAML's model section)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("composer_load_path runs before the process group starts (each rank converts alone)")
    if not is_checkpoint_file(url):
        raise ComposerCheckpointError(f"{url}: not a Composer checkpoint file (a .pt or .tar that Composer saved)")
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = filled_once(root / f"composer-{_name(url)}-{_fingerprint(url, mpt_config)}",
                         lambda partial: _convert(url, mpt_config, partial))
    summary = json.loads((target / SUMMARY).read_text())
    return ComposerStart(str(target), summary["weights_only"], summary["model"])


def composer_trainer_config(config: TrainerConfig, model: Any = None) -> TrainerConfig:
    """`config` itself, or, when its `load_path` is a Composer checkpoint file, with `load_path` at that
    checkpoint's Tessera form (weights only, with a warning saying why, when the rest does not map).
    `model`: the run's model; a GPT of another shape than the checkpoint's is refused naming the keys.
    A run that autoresumes from its own checkpoint leaves load_path unused: nothing is converted then."""
    if config.load_path and is_sharded_composer(config.load_path):
        raise ComposerCheckpointError(sharded_composer_message(f"load_path={config.load_path}"))
    if not config.load_path or not is_checkpoint_file(config.load_path) or resumes_own_checkpoint(config):
        return config
    start = composer_load_path(config.load_path)
    ours = model.cfg.to_dict() if hasattr(model, "cfg") else None
    differ = [k for k, v in start.model.items() if ours is not None and k not in _NOT_COMPARED and ours.get(k) != v]
    if differ:
        raise ComposerCheckpointError(f"load_path={config.load_path}: the checkpoint's model differs from the run's: "
                                      + ", ".join(f"model.{k} is {ours[k]!r} here, {start.model[k]!r} there"
                                                  for k in differ))
    if start.weights_only is not None and not config.load_weights_only:
        warnings.warn(f"load_path={config.load_path}: only the weights carry over: {start.weights_only}",
                      stacklevel=2)
    return config.model_copy(update={"load_path": start.url,
                                     "load_weights_only": config.load_weights_only or start.weights_only is not None})


def _convert(url: str, mpt_config: Mapping[str, Any] | None, partial: Path) -> None:
    ckpt = read_composer_checkpoint(url, mpt_config)
    with CheckpointManager(partial, async_save=False) as manager:
        manager.save(ckpt.state())
    summary = {"source": url, "model": ckpt.config.to_dict(), "weights_only": ckpt.weights_only}
    (partial / SUMMARY).write_text(json.dumps(summary, indent=2))


def _name(url: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", url.rstrip("/").rsplit("/", 1)[-1]) or "checkpoint"


def _fingerprint(url: str, mpt_config: Mapping[str, Any] | None) -> str:
    """The source's URL, size and mtime (ETag in a bucket), and the config given for it."""
    digest = hashlib.sha256(f"{url}\n{checkpoint_version(url)}".encode())
    if mpt_config is not None:
        digest.update(repr(sorted(mpt_config.items())).encode())
    return digest.hexdigest()[:16]
