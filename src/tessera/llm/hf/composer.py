"""Composer checkpoints of MPT models (LLM Foundry runs), read for Tessera's GPT: the weights, and for a run
that continues, the optimizer state, the timestamp and the RNG state.

    ckpt = read_composer_checkpoint("s3://bucket/run/checkpoints/ep0-ba100-rank0.pt")
    ckpt.model                  # the GPT's state dict (ckpt.config: its GPTConfig)
    ckpt.weights_only           # None, or why only the weights carry over (said in one line)
    ckpt.state()                # Tessera's checkpoint layout: apply_state(ckpt.state(), model, [opt])

What Composer writes (composer/utils/checkpoint.py `_save_checkpoint`, composer/core/state.py
`State.state_dict`): one `torch.save` file (or a .tar holding `composer_states.pt`) of

    {"state": {"model": {"model.transformer.wte.weight": ..., ...},         # HuggingFaceModel's `.model`
               "optimizers": {"DecoupledAdamW": {"state": {FQN: {"exp_avg", "exp_avg_sq", "step"}},
                                                 "param_groups": [{"lr", "betas", "eps", "weight_decay",
                                                                   "initial_lr", "params": [FQN...]}]}},
               "timestamp": {"Timestamp": {"epoch", "batch", "sample", "token", "batch_in_epoch", ...}},
               "integrations": {"huggingface": {"model": {"config": {"content": <MPT config.json>}},
                                                "tokenizer": {FILE: {"file_extension", "content"}}}},
               "metadata": {"world_size", "train_dataloader_batch_size", ...}, "schedulers": ..., ...},
     "rng": [{"python", "numpy", "torch", "cuda"} per rank]}

A weights-only save (`save_weights_only`) has `state.model`, `integrations` and `metadata` only. The file is
read as Composer reads it, `torch.load(weights_only=True)` with Composer's allowlist (timedelta, numpy
arrays): nothing in a checkpoint runs code here. The model config comes from `integrations` (Composer's
HuggingFaceModel always writes it), or from the caller (a Foundry YAML's `model` section).

The optimizer state maps when it is Composer's DecoupledAdamW or torch's AdamW with one parameter group
and state keyed by parameter name (Composer's `get_optimizer_state_dict`): Tessera's DecoupledAdamW
decays the same `weight_decay * lr / initial_lr` per step (train/optim.py). Otherwise only the weights
carry over, and `weights_only` says why. The data loader's position carries over as Composer saved it
(`dataset_state.train`, MosaicML Streaming's `epoch`/`sample_in_epoch` state, which Tessera's streaming
loader reads: tessera/stream/batching/resume_state.py).
"""

from __future__ import annotations

import datetime
import json
import re
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tessera.llm.hf.cache import default_cache_dir
from tessera.llm.hf.mpt import MptUnsupported, gpt_config_from_mpt, gpt_names, gpt_state_from_mpt
from tessera.llm.model import GPT, GPTConfig
from tessera.llm.model_source import COMPRESSED_MAGIC, is_remote
from tessera.progress import WorkProgress
from tessera.storage import download_from, open_store, split_url
from tessera.train.optim import DecoupledAdamW
from tessera.train.time import Timestamp

PREFIX = "model."  # Composer's HuggingFaceModel holds the MPT as `.model`
TAR_MEMBER = "composer_states.pt"
_OPTIMIZERS = {"DecoupledAdamW": DecoupledAdamW, "AdamW": torch.optim.AdamW}


class ComposerCheckpointError(ValueError):
    """A file that is not a readable Composer checkpoint of an MPT model; the message is one line."""


def _safe_globals() -> list[Any]:
    """Composer's own allowlist for `torch.load(weights_only=True)` (composer/utils/checkpoint.py)."""
    from numpy._core.multiarray import _reconstruct
    from torch.torch_version import TorchVersion

    allowed: list[Any] = [datetime.timedelta, np.ndarray, np.dtype, TorchVersion, _reconstruct,
                          (_reconstruct, "numpy.core.multiarray._reconstruct")]  # as numpy 1 pickles name it
    allowed += [t for t in vars(np.dtypes).values() if isinstance(t, type) and issubclass(t, np.dtype)]
    return allowed


@dataclass
class ComposerCheckpoint:
    """What a Composer checkpoint holds, in the GPT's terms."""

    url: str
    config: GPTConfig
    mpt_config: dict[str, Any]
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None = None      # a torch state dict for the GPT's parameters, in their order
    optimizer_name: str | None = None
    timestamp: Timestamp | None = None
    rng: dict[str, Any] | None = None            # rank 0's, in Tessera's form (train/checkpoint/rng.py)
    dataloader: dict[str, Any] | None = None     # Streaming's state of the train dataset
    global_batch_size: int | None = None
    weights_only: str | None = None              # why only the weights carry over; None when all of it does
    tokenizer_files: dict[str, Any] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        """Tessera's checkpoint layout (train/checkpoint/state.py): what `CheckpointManager.save` writes and
        `apply_state` loads. A weights-only checkpoint starts at batch 0 with a fresh optimizer."""
        full = self.weights_only is None
        config: dict[str, Any] = {"model": self.config.to_dict(), "composer": {
            "url": self.url, "optimizer": self.optimizer_name, "weights_only": self.weights_only}}
        if self.global_batch_size:
            config["global_batch_size"] = self.global_batch_size
        return {"model": self.model, "optimizers": [self.optimizer] if full else [], "schedulers": [],
                "scaler": None, "timestamp": (self.timestamp if full and self.timestamp else Timestamp()).state_dict(),
                "rng": self.rng if full else None, "dataloader": self.dataloader if full else None, "config": config,
                "sharded": False}


def read_composer_checkpoint(url: str, mpt_config: Mapping[str, Any] | None = None) -> ComposerCheckpoint:
    """The Composer checkpoint at `url` (a local file or a bucket object). `mpt_config`: the MPT config
    when the checkpoint has none (or to override it). ComposerCheckpointError / MptUnsupported: one line."""
    with _local_file(url) as path:
        raw = _torch_load(path, url)
    state = raw.get("state") if isinstance(raw, dict) else None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        keys = ", ".join(sorted(map(str, raw))[:4]) if isinstance(raw, dict) else type(raw).__name__
        raise ComposerCheckpointError(f"{url}: not a Composer checkpoint: it has no state.model (it holds {keys})")
    hf = (state.get("integrations") or {}).get("huggingface") or {}
    if (hf.get("model") or {}).get("peft_config"):
        raise ComposerCheckpointError(f"{url}: a PEFT (LoRA) Composer checkpoint; only whole MPT models load into "
                                      "Tessera's GPT (merge the adapter first)")
    config = dict(mpt_config if mpt_config is not None else (hf.get("model") or {}).get("config", {}).get("content") or {})
    if not config:
        raise ComposerCheckpointError(f"{url}: no model config in the checkpoint (state.integrations.huggingface, "
                                      "written by Composer's HuggingFaceModel); give the Foundry model section")
    cfg = gpt_config_from_mpt(config, url)
    ckpt = ComposerCheckpoint(url, cfg, config, gpt_state_from_mpt(state["model"], cfg, url, PREFIX),
                              tokenizer_files=dict(hf.get("tokenizer") or {}))
    metadata = state.get("metadata") or {}
    if metadata.get("train_dataloader_batch_size") and metadata.get("world_size"):
        ckpt.global_batch_size = int(metadata["train_dataloader_batch_size"]) * int(metadata["world_size"])
    ckpt.optimizer_name, ckpt.optimizer, ckpt.weights_only = _optimizer(state.get("optimizers"), cfg)
    if ckpt.weights_only is None:
        ckpt.timestamp = _timestamp(state.get("timestamp"))
        ckpt.rng = _rng(raw.get("rng"))
        train = (state.get("dataset_state") or {}).get("train")
        ckpt.dataloader = train if isinstance(train, dict) and {"epoch", "sample_in_epoch"} <= set(train) else None
    return ckpt


def checkpoint_version(url: str) -> str:
    """What tells one version of the file at `url` from another: its size and mtime (its ETag in a bucket)."""
    if is_remote(url):
        root, key = split_url(url)
        info = open_store(root).head(key)
        return f"{info.size}\t{info.etag or ''}"
    stat = Path(url.removeprefix("file://")).expanduser().stat()
    return f"{stat.st_size}\t{stat.st_mtime_ns}"


@contextmanager
def _local_file(url: str) -> Iterator[Path]:
    """A local path to the checkpoint file: itself, a download of a bucket object (into the model cache's
    folder, which is sized for models), or the states file inside a Composer .tar."""
    with tempfile.TemporaryDirectory(prefix=".composer-", dir=_scratch(url)) as tmp:
        path = Path(url.removeprefix("file://")).expanduser()
        if is_remote(url):
            path = Path(tmp) / url.rstrip("/").rsplit("/", 1)[-1]
            root, key = split_url(url)
            store = open_store(root)
            with WorkProgress(f"downloading {path.name}", unit="bytes", total=store.head(key).size) as progress:
                download_from(store, key, path, progress=progress.advance)
        if not path.is_file():
            raise ComposerCheckpointError(f"{url}: no such checkpoint file")
        with path.open("rb") as f:
            head = f.read(6)
        kind = next((name for magic, name in COMPRESSED_MAGIC.items() if head.startswith(magic)), None)
        if kind is not None:
            raise ComposerCheckpointError(f"{url}: a {kind}-compressed checkpoint; decompress it first "
                                          f"(Tessera reads .pt and .tar Composer checkpoints)")
        if tarfile.is_tarfile(path):
            with tarfile.open(path) as tar:
                member = next((m for m in tar.getmembers() if Path(m.name).name == TAR_MEMBER and m.isfile()), None)
                if member is None:
                    raise ComposerCheckpointError(f"{url}: a tar archive without {TAR_MEMBER}; not a Composer checkpoint")
                tar.extract(member, tmp, filter="data")
                path = Path(tmp) / member.name
        yield path


def _scratch(url: str) -> Path | None:
    """Where a remote checkpoint is downloaded: beside the model cache (None: the system's temp folder)."""
    if not is_remote(url):
        return None
    root = default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _torch_load(path: Path, url: str) -> Any:
    """The file's contents as plain data; any failure is one line naming the file."""
    import pickle

    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=_is_zip(path))
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f"a pickled {found.group(1)} object" if found else "pickled objects beyond plain data"
        raise ComposerCheckpointError(f"{url}: holds {what}; Tessera reads checkpoints as plain data only "
                                      "(torch.load weights_only), as Composer does") from None
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        detail = str(exc).strip().splitlines()[0].split(". ")[0] if str(exc).strip() else type(exc).__name__
        raise ComposerCheckpointError(f"{url}: not a readable torch checkpoint (damaged or truncated?): "
                                      f"{detail}") from None


def _is_zip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _optimizer(saved: Any, cfg: GPTConfig) -> tuple[str | None, dict[str, Any] | None, str | None]:
    """(optimizer class name, its state for the GPT in torch's form, None) when it maps, else
    (name, None, why only the weights carry over)."""
    if not saved:
        return None, None, "the checkpoint holds no optimizer state (a weights-only save)"
    if not isinstance(saved, dict) or len(saved) != 1:
        return None, None, f"it holds {len(saved) if isinstance(saved, dict) else 0} optimizers; Tessera runs one"
    (name, optim), = saved.items()
    groups, per_param = optim.get("param_groups") or [], optim.get("state") or {}
    if name not in _OPTIMIZERS:
        return name, None, f"its optimizer {name} has no Tessera counterpart (DecoupledAdamW, AdamW)"
    if len(groups) != 1 or groups[0].get("amsgrad"):
        return name, None, f"its {name} has {len(groups)} parameter groups or amsgrad; Tessera's has one, no amsgrad"
    if any(not isinstance(key, str) for key in per_param):
        return name, None, f"its {name} state is keyed by parameter position, not name (an older Composer)"
    by_field: dict[str, dict[str, torch.Tensor]] = {}
    for fqn, values in per_param.items():
        for key, value in values.items():
            by_field.setdefault(key, {})[fqn] = value
    try:
        renamed = {key: gpt_names(values, PREFIX) for key, values in by_field.items()}
    except MptUnsupported as exc:
        return name, None, f"its {name} state does not map: {exc}"
    with torch.device("meta"):
        params = list(GPT(cfg).named_parameters())
    shapes = {n: tuple(p.shape) for n, p in params}
    stray = sorted({n for values in renamed.values() for n in values} - set(shapes))
    if stray:
        return name, None, f"its {name} state names {stray[0]}, which the model does not have"
    state: dict[int, dict[str, torch.Tensor]] = {}
    for index, (param, _) in enumerate(params):
        values = {key: renamed[key][param] for key in renamed if param in renamed[key]}
        bad = [key for key, v in values.items() if v.dim() and tuple(v.shape) != shapes[param]]
        if bad:
            return name, None, f"its {name} {bad[0]} of {param} has shape {tuple(values[bad[0]].shape)}"
        if values:
            state[index] = values
    return name, {"state": state, "param_groups": [_group(name, groups[0], len(params))]}, None


def _group(name: str, saved: dict[str, Any], n_params: int) -> dict[str, Any]:
    """The parameter group Tessera's optimizer of that kind keeps (every key it reads), with the saved values."""
    lr, wd = float(saved.get("lr", 1e-3)), float(saved.get("weight_decay", 0.0))
    probe = _OPTIMIZERS[name]([torch.nn.Parameter(torch.zeros(1))], lr=lr, betas=tuple(saved.get("betas", (0.9, 0.95))),
                              eps=float(saved.get("eps", 1e-8)), weight_decay=wd)
    group = probe.state_dict()["param_groups"][0]
    group["initial_lr"] = float(saved.get("initial_lr", lr))
    group["params"] = list(range(n_params))
    return group


def _timestamp(saved: Any) -> Timestamp | None:
    values = (saved or {}).get("Timestamp") if isinstance(saved, dict) else None
    if not isinstance(values, dict):
        return None
    keys = ("epoch", "batch", "sample", "token", "batch_in_epoch", "sample_in_epoch", "token_in_epoch")
    return Timestamp(**{key: int(values.get(key, 0)) for key in keys})


def _rng(saved: Any) -> dict[str, Any] | None:
    """Composer's rank-0 RNG state (`reproducibility.get_rng_state`) in Tessera's form (`capture_rng_state`)."""
    if not isinstance(saved, list) or not saved or not isinstance(saved[0], dict):
        return None
    rank0 = saved[0]
    try:
        version, internal, gauss = rank0["python"]
        kind, keys, pos, has_gauss, cached = rank0["numpy"]
        cuda = rank0.get("cuda")
        return {"python": [version, list(internal), gauss],
                "numpy": [kind, torch.from_numpy(np.asarray(keys).astype(np.int64)), int(pos), int(has_gauss),
                          float(cached)],
                "torch": rank0["torch"], "cuda": [cuda] if isinstance(cuda, torch.Tensor) else []}
    except (KeyError, TypeError, ValueError):
        return None


def composer_tokenizer(ckpt: ComposerCheckpoint) -> Any:
    """The transformers tokenizer saved in the checkpoint (Composer's HuggingFaceModel keeps its files'
    contents), or None when there is none."""
    if not ckpt.tokenizer_files:
        return None
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="tessera-composer-tokenizer-") as tmp:
        for name, entry in ckpt.tokenizer_files.items():
            content, path = entry.get("content"), Path(tmp) / Path(name).name
            if isinstance(content, bytes):
                path.write_bytes(content)
            elif isinstance(content, list):  # .txt files are saved as their lines
                path.write_text("\n".join(content), encoding="utf-8")
            elif isinstance(content, str):
                path.write_text(content, encoding="utf-8")
            else:
                path.write_text(json.dumps(content), encoding="utf-8")
        return AutoTokenizer.from_pretrained(tmp, local_files_only=True)
