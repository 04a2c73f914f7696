"""The torch files of one checkpoint folder on local disk: plain `torch.save` files and DCP shards.

A save writes its staged state here before the upload (`write_state_files`); a load reads a downloaded,
verified folder back into a state dict (`read_state`), resharding DCP shards into the current model.
"""

from __future__ import annotations

import json
import pickle
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from tessera.train.checkpoint.layout import DCP_DIR, META, MODEL, TRAIN_STATE
from tessera.train.checkpoint.rng import derive_rng_state
from tessera.train.checkpoint.state import model_state, unwrap_model

# DCP warns on every single-process save/load; single-process use is intended here (one rank, or a
# full load without a process group). `catch_warnings` is not thread-safe, so filter the message once.
warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavailable or uninitialized, "
                        r"assuming the intent is to (save|load) in a single process", category=UserWarning)


def save_file(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)


def load_file(path: Path, allow_pickle: bool) -> Any:
    """torch.load, restricted to tensors and plain containers unless `allow_pickle`."""
    try:
        return torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError as exc:
        raise pickle.UnpicklingError(
            f"{path.name} holds Python objects beyond tensors and plain containers (in the dataloader "
            f"state or elsewhere); pass allow_pickle=True to CheckpointManager if you trust where the "
            f"checkpoint comes from ({str(exc).splitlines()[0]})") from None


def dcp_save(state: dict[str, Any], folder: Path, process_group: Any) -> None:
    """Write this rank's shards of `state` (and, on the coordinator, `.metadata`) to a local folder."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    distributed = dist.is_available() and dist.is_initialized()
    writer = dcp.FileSystemWriter(str(folder), sync_files=False)
    dcp.save(state, storage_writer=writer, process_group=process_group, no_dist=not distributed)


def dcp_load_into(template: dict[str, Any], folder: Path, process_group: Any, strict: bool) -> None:
    """Fill `template` (the current model's state dicts, any sharding) from a local DCP folder."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    distributed = dist.is_available() and dist.is_initialized()
    dcp.load(template, storage_reader=dcp.FileSystemReader(str(folder)),
             planner=DefaultLoadPlanner(allow_partial_load=not strict), process_group=process_group,
             no_dist=not distributed)


def dcp_load_full(folder: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """The tensors of a DCP folder as full (unsharded) tensors, in this process alone: no collective
    even when a process group exists (export, or one rank reading weights). `keys` = top-level entries
    to read ({"model"} for weights only: the optimizer moments, twice the model's size, are skipped).

    Read straight into memory with DCP's own metadata-driven planner (what `dcp_to_torch_save` uses
    internally), rather than through `dcp_to_torch_save`, which writes the whole state to a temporary
    torch file first: a second full copy on disk for a 7B model's export."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(folder)),
                     planner=_EmptyStateDictLoadPlanner(keys=keys), no_dist=True)
    return state


def sharded_template(model: torch.nn.Module, optimizers: Iterable[torch.optim.Optimizer],
                     weights_only: bool) -> dict[str, Any]:
    """The state dicts DCP loads into: the current model's (and optimizers') own layout."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    inner = unwrap_model(model)
    template: dict[str, Any] = {"model": model_state(inner, sharded=True)}  # trainable-only if some are frozen
    if not weights_only:
        template["optimizers"] = [get_optimizer_state_dict(inner, opt) for opt in optimizers]
    return template



def write_state_files(local: Path, files: dict[str, Any], meta: bytes | None, dcp_state: dict[str, Any] | None,
                      process_group: Any) -> None:
    """Write a staged save into `local`: torch files, meta.json, and this rank's DCP shards."""
    for key, obj in files.items():
        save_file(obj, local / key)
    if meta is not None:
        (local / META).write_bytes(meta)
    if dcp_state is not None:
        dcp_save(dcp_state, local / DCP_DIR, process_group)


def read_state(local: Path, *, sharded: bool, rank_file: str | None, derive_rng_for: int | None,
               model: torch.nn.Module | None, optimizers: Sequence[torch.optim.Optimizer], strict: bool,
               process_group: Any, allow_pickle: bool) -> dict[str, Any]:
    """The state of a downloaded, verified checkpoint folder (see `CheckpointManager.load`).

    `rank_file` None means weights only. A sharded checkpoint is resharded into `model`'s layout when a
    model is given, else loaded as full tensors. `derive_rng_for` = a rank that did not exist at save
    time: its RNG state is derived from `rank_file` (rank 0's).
    """
    weights_only = rank_file is None
    meta = json.loads((local / META).read_bytes())
    state: dict[str, Any] = {"config": meta.get("config", {}), "sharded": sharded}
    if sharded and model is not None:
        template = sharded_template(model, optimizers, weights_only)
        dcp_load_into(template, local / DCP_DIR, process_group, strict)
        state.update(template)
    elif sharded:
        full = dcp_load_full(local / DCP_DIR, keys={"model"} if weights_only else None)
        state["model"] = full["model"]
        if not weights_only:
            state["optimizers"] = full.get("optimizers", [])
    else:
        state["model"] = load_file(local / MODEL, allow_pickle)
    if not weights_only:
        train = load_file(local / TRAIN_STATE, allow_pickle)
        if not sharded:
            state["optimizers"] = train.get("optimizers", [])
        state["schedulers"] = train.get("schedulers", [])
        state["scaler"] = train.get("scaler")
        own = load_file(local / rank_file, allow_pickle)
        state["rng"] = own["rng"] if derive_rng_for is None else derive_rng_state(own["rng"], derive_rng_for)
        state["dataloader"] = own.get("dataloader")
    return state
