"""Export: a model as safetensors + a config JSON (+ its tokenizer), in a folder or bucket; and load back.

    save_pretrained(model, "out/gpt-tiny", tokenizer=tok)      # or "s3://bucket/models/gpt-tiny"
    model, tok = load_pretrained("out/gpt-tiny")
    model, tok = load_model("s3://bucket/runs/r1/checkpoints")  # an export, or a training checkpoint

The folder holds `model.safetensors`, `tokenizer.json` (when a tokenizer is given) and `config.json`,
written last so that a folder with a config is complete:

    {"format": "tessera-gpt", "version": 1, "model": {<GPTConfig fields>}, "tokenizer": "tokenizer.json"}

Checkpoints (see tessera.train.checkpoint) are read through `CheckpointManager.load(weights_only=True)`.
A sharded (DCP) checkpoint, written by FSDP or tensor-parallel ranks, is assembled into full tensors in
this one process: no process group and none of the ranks that saved it are needed, and the export is
one `model.safetensors` whatever the number of shards.
Their run config must hold the model config under "model" (GPTConfig fields, optionally "name" of a named
config) and may name the tokenizer under "tokenizer" (a path, "byte", or {"path": ...}).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from tessera.llm.model import GPT, GPTConfig
from tessera.llm.model_source import CONFIG, EXPORT_FORMAT, resolve_model_source
from tessera.llm.tokenizer import Tokenizer, load_tokenizer
from tessera.progress import WorkProgress
from tessera.storage import NotFound, Store, open_store

WEIGHTS, TOKENIZER = "model.safetensors", "tokenizer.json"
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile and DDP wrappers


class ExportError(ValueError):
    """A folder is neither an export nor a checkpoint, or its config does not describe a model."""


def save_pretrained(model: GPT, out: str | os.PathLike[str] | Store, tokenizer: Tokenizer | None = None,
                    metadata: dict[str, str] | None = None) -> str:
    """Write the model (and tokenizer) to `out`; returns the folder's URL."""
    from safetensors.torch import save_file

    store = out if isinstance(out, Store) else open_store(out)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory(prefix="tessera-export-") as tmp:
        weights = Path(tmp) / WEIGHTS
        save_file(tensors, weights, metadata={"format": "pt", **(metadata or {})})
        files = [(WEIGHTS, weights)]
        if tokenizer is not None:
            tokenizer.save(Path(tmp) / TOKENIZER)
            files.append((TOKENIZER, Path(tmp) / TOKENIZER))
        upload_files(store, files)
    config = {"format": EXPORT_FORMAT, "version": 1, "model": model.cfg.to_dict(),
              "tokenizer": TOKENIZER if tokenizer is not None else None}
    store.put(CONFIG, json.dumps(config, indent=2).encode())
    return store.url


def upload_files(store: Store, files: list[tuple[str, Path]]) -> None:
    """Put each (key, local file) into `store`, in order, showing the bytes sent (tessera.progress): after
    the load, the upload is an export's long part for a large model going to a bucket."""
    sizes = [path.stat().st_size for _, path in files]
    with WorkProgress(f"uploading to {store.url}", unit="bytes", total=sum(sizes)) as progress:
        for (key, path), size in zip(files, sizes, strict=True):
            store.put_file(key, path)
            progress.advance(size)


def _read_config(store: Store) -> dict[str, Any] | None:
    try:
        config = json.loads(store.get(CONFIG))
    except NotFound:
        return None
    if config.get("format") != EXPORT_FORMAT:
        raise ExportError(f"{store.url_for(CONFIG)}: not a tessera model export (format {config.get('format')!r})")
    return config


def _local_copy(store: Store, key: str, tmp: str) -> Path:
    path = store.local_path(key)
    if path is not None and path.is_file():
        return path
    path = Path(tmp) / key
    path.write_bytes(store.get(key))
    return path


def load_pretrained(folder: str | os.PathLike[str] | Store, device: torch.device | str = "cpu",
                    ) -> tuple[GPT, Tokenizer | None]:
    """The model and tokenizer (None if the export has none) saved by `save_pretrained`."""
    from safetensors.torch import load_file

    store = folder if isinstance(folder, Store) else open_store(folder)
    described = describe_export(store)
    if described is None:
        raise ExportError(f"{store.url}: no {CONFIG}; not an export (or an unfinished one)")
    model = GPT(described[0])
    with tempfile.TemporaryDirectory(prefix="tessera-load-") as tmp:
        model.load_state_dict(load_file(_local_copy(store, WEIGHTS, tmp)))
    return model.to(device).eval(), described[1]


def describe_export(folder: str | os.PathLike[str] | Store) -> tuple[GPTConfig, Tokenizer | None] | None:
    """An export's model config and tokenizer without reading its weights; None if it is not an export."""
    store = folder if isinstance(folder, Store) else open_store(folder)
    config = _read_config(store)
    if config is None:
        return None
    tokenizer = None
    if config.get("tokenizer") == "byte":
        tokenizer = load_tokenizer("byte")
    elif config.get("tokenizer"):
        with tempfile.TemporaryDirectory(prefix="tessera-load-") as tmp:
            tokenizer = load_tokenizer(_local_copy(store, config["tokenizer"], tmp))
    return GPTConfig.from_dict(config["model"]), tokenizer


def model_config_from_run(run_config: dict[str, Any]) -> GPTConfig:
    """The GPTConfig in a training run's config (its "model" section; keys it does not know are ignored)."""
    section = run_config.get("model")
    if not isinstance(section, dict):
        raise ExportError("the checkpoint's run config has no 'model' section to build the model from")
    known = {f for f in GPTConfig.__dataclass_fields__} | {"name"}
    return GPTConfig.from_dict({k: v for k, v in section.items() if k in known})


def tokenizer_from_run(run_config: dict[str, Any]) -> Tokenizer | None:
    spec = run_config.get("tokenizer")
    if isinstance(spec, dict):
        spec = spec.get("path") or spec.get("name")
    if not spec:
        return None
    try:
        return load_tokenizer(spec)
    except ValueError:
        return None  # moved since training; the caller can pass one explicitly


def load_model(path: str | os.PathLike[str], device: torch.device | str = "cpu",
               ) -> tuple[GPT, Tokenizer | None]:
    """A GPT from an export folder, a checkpoint folder, or a run's checkpoint root (newest checkpoint);
    what `path` is, is `resolve_model_source`'s to say (NotAModel: a hub id, nothing there)."""
    source = resolve_model_source(path)
    if source.kind in ("transformers", "composer"):
        what = "a transformers model folder" if source.kind == "transformers" else "a Composer checkpoint"
        raise ExportError(f"{os.fspath(path)}: {what}, not a Tessera GPT (export or checkpoint); "
                          "tessera.llm.hf.mpt_load.load_gpt reads MPT ones")
    if source.kind == "export":
        return load_pretrained(open_store(path), device)
    state = _checkpoint_state(path)
    model = GPT(model_config_from_run(state.get("config") or {}))
    weights = state["model"]
    model.load_state_dict(weights)
    return model.to(device).eval(), tokenizer_from_run(state.get("config") or {})


def checkpoint_weights(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The weights-only state of a checkpoint folder (or the newest under a run's checkpoint root), with
    the keys of DDP and torch.compile wrappers stripped; "config" is the run config it was saved with."""
    kind = resolve_model_source(path).kind
    if kind != "checkpoint":
        what = {"transformers": "a transformers model folder", "composer": "a Composer checkpoint file"}.get(
            kind, "a model export")
        raise ExportError(f"{os.fspath(path)}: {what}, not a training checkpoint")
    return _checkpoint_state(path)


def _checkpoint_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    from tessera.train.checkpoint import CheckpointManager

    manager = CheckpointManager(os.fspath(path))
    try:
        state = manager.load(os.fspath(path), weights_only=True)
    except Exception as exc:
        raise ExportError(f"{path}: neither a model export (no {CONFIG}) nor a loadable checkpoint: {exc}") from exc
    finally:
        manager.close()
    state["model"] = {_strip_prefixes(k): v for k, v in state["model"].items()}
    return state


def _strip_prefixes(key: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        key = key.removeprefix(prefix)
    return key
