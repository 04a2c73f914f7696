"""The torch side of checkpoints: what goes in the state, RNG capture and derivation, host staging,
plain files and torch.distributed.checkpoint (DCP). No storage or threading here.

State dict (what `capture_state` builds, `CheckpointManager.save` writes and `load` returns):

    {"model": state_dict, "optimizers": [state_dict, ...], "schedulers": [state_dict, ...],
     "scaler": state_dict | None, "timestamp": Timestamp.state_dict(), "rng": capture_rng_state(),
     "dataloader": any picklable value, "config": JSON-able dict, "sharded": bool}

Non-sharded states hold ordinary `module.state_dict()` / `optimizer.state_dict()` (DDP wrappers are
unwrapped, so a checkpoint from 4 DDP ranks loads into a bare model). Sharded states hold DCP's
`get_model_state_dict` / `get_optimizer_state_dict` forms (DTensor shards, optimizer state keyed by
parameter name), which DCP reshards to any world size on load.

RNG for ranks that did not exist at save time (`derive_rng_state`): a resumed run with more ranks than
the saved one needs RNG states for the new ranks. Rank r >= saved world size gets a state derived from
the saved rank-0 state and r: seed = xxh64(b"tessera-rng/1" + rank-0 torch CPU state + r as 8 bytes,
little-endian); python's `random` gets `Random(seed)`, numpy's legacy global generator gets
`RandomState(MT19937(seed))`, torch CPU `manual_seed(seed mod 2**63)`, CUDA device d seed + d + 1. The
same saved state and rank always give the same streams; different ranks get independent ones.
"""

from __future__ import annotations

import copy
import json
import pickle
import random
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from tessera.train.manifest import DCP_DIR, META, MODEL, TRAIN_STATE
from tessera.train.time import Timestamp

_RNG_TAG = b"tessera-rng/1"
# DCP warns on every single-process save/load; single-process use is intended here (one rank, or a
# full load without a process group). `catch_warnings` is not thread-safe, so filter the message once.
warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavailable or uninitialized, "
                        r"assuming the intent is to (save|load) in a single process", category=UserWarning)


# --- RNG -------------------------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: python `random`, numpy's global generator, torch CPU and CUDA.

    Only plain types and tensors, so it loads with `torch.load(weights_only=True)`.
    """
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = ([torch.cuda.get_rng_state(d) for d in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else [])
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss),
                      float(cached)],
            "torch": torch.get_rng_state(), "cuda": cuda}


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set every generator `capture_rng_state` covers; CUDA states beyond the visible devices are skipped."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        for device, cuda_state in enumerate(state.get("cuda") or []):
            if device < torch.cuda.device_count():
                torch.cuda.set_rng_state(cuda_state, device)


def derive_rng_state(rank0_state: dict[str, Any], rank: int) -> dict[str, Any]:
    """A deterministic RNG state for `rank`, derived from the saved rank-0 state (see module docstring)."""
    digest = xxhash.xxh64(_RNG_TAG)
    digest.update(rank0_state["torch"].numpy().tobytes())
    digest.update(int(rank).to_bytes(8, "little"))
    seed = digest.intdigest()
    version, internal, gauss = random.Random(seed).getstate()
    kind, keys, pos, has_gauss, cached = np.random.RandomState(np.random.MT19937(seed)).get_state()
    torch_state = torch.Generator().manual_seed(seed % 2**63).get_state()
    devices = len(rank0_state.get("cuda") or []) if torch.cuda.is_available() else 0
    devices = min(devices, torch.cuda.device_count()) if devices else 0
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
            "torch": torch_state,
            "cuda": [_cuda_state_for_seed((seed + d + 1) % 2**63, d) for d in range(devices)]}


def _cuda_state_for_seed(seed: int, device: int) -> torch.Tensor:
    generator = torch.Generator(device=f"cuda:{device}")
    generator.manual_seed(seed)
    return generator.get_state()


# --- what goes in a checkpoint -----------------------------------------------------------------------


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DistributedDataParallel (so its keys carry no 'module.' prefix)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def has_dtensor(obj: Any) -> bool:
    """Whether a (nested) state dict holds DTensors, i.e. is a sharded state."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return True
    if isinstance(obj, dict):
        return any(has_dtensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(has_dtensor(v) for v in obj)
    return False


def is_sharded_model(model: torch.nn.Module) -> bool:
    """True for an FSDP2 (`fully_shard`) model or any model whose parameters are DTensors."""
    from torch.distributed.fsdp import FSDPModule

    model = unwrap_model(model)
    return isinstance(model, FSDPModule) or any(has_dtensor(p) for p in model.parameters())


def capture_state(model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = (),
                  schedulers: Sequence[Any] = (), scaler: Any = None, *, timestamp: Timestamp,
                  dataloader: Any = None, config: dict[str, Any] | None = None,
                  sharded: bool | None = None) -> dict[str, Any]:
    """The state dict of a training run, in the layout `CheckpointManager.save` expects.

    It references live tensors (no copy): `save` stages its own copy before returning. `sharded`
    defaults to `is_sharded_model(model)`; True makes a DCP state even for a plain or DDP model.
    """
    sharded = is_sharded_model(model) if sharded is None else sharded
    optimizers = list(optimizers)
    if sharded:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        inner = unwrap_model(model)
        model_state = get_model_state_dict(inner)
        optim_states = [get_optimizer_state_dict(inner, opt) for opt in optimizers]
    else:
        model_state = unwrap_model(model).state_dict()
        optim_states = [opt.state_dict() for opt in optimizers]
    return {"model": model_state, "optimizers": optim_states,
            "schedulers": [s.state_dict() for s in schedulers],
            "scaler": scaler.state_dict() if scaler is not None else None,
            "timestamp": timestamp.state_dict(), "rng": capture_rng_state(), "dataloader": dataloader,
            "config": config or {}, "sharded": sharded}


def apply_state(state: dict[str, Any], model: torch.nn.Module | None = None,
                optimizers: Sequence[torch.optim.Optimizer] = (), schedulers: Sequence[Any] = (),
                scaler: Any = None, *, strict: bool = True, restore_rng: bool = True) -> None:
    """Load a state from `CheckpointManager.load` into live objects (the inverse of `capture_state`).

    Parts missing from `state` (e.g. after a weights-only load) are left alone. Sharded states are set
    with DCP's `set_model_state_dict` / `set_optimizer_state_dict`, which also accept full tensors.
    """
    optimizers, schedulers = list(optimizers), list(schedulers)
    sharded = bool(state.get("sharded"))
    if model is not None and "model" in state:
        inner = unwrap_model(model)
        if sharded or is_sharded_model(inner):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            full = not has_dtensor(state["model"])
            set_model_state_dict(inner, state["model"],
                                 options=StateDictOptions(strict=strict, full_state_dict=full))
        else:
            inner.load_state_dict(state["model"], strict=strict)
    saved_optims = state.get("optimizers") or []
    if optimizers and saved_optims:
        if len(saved_optims) != len(optimizers):
            raise ValueError(f"the checkpoint has {len(saved_optims)} optimizer state(s), "
                             f"but {len(optimizers)} optimizer(s) were given")
        for opt, opt_state in zip(optimizers, saved_optims, strict=True):
            if sharded:
                from torch.distributed.checkpoint.state_dict import (
                    StateDictOptions,
                    set_optimizer_state_dict,
                )

                full = not has_dtensor(opt_state)
                set_optimizer_state_dict(unwrap_model(model), opt, opt_state,
                                         options=StateDictOptions(strict=strict, full_state_dict=full))
            else:
                opt.load_state_dict(opt_state)
    saved_scheds = state.get("schedulers") or []
    if schedulers and saved_scheds:
        if len(saved_scheds) != len(schedulers):
            raise ValueError(f"the checkpoint has {len(saved_scheds)} scheduler state(s), "
                             f"but {len(schedulers)} scheduler(s) were given")
        for sched, sched_state in zip(schedulers, saved_scheds, strict=True):
            sched.load_state_dict(sched_state)
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    if restore_rng and state.get("rng") is not None:
        restore_rng_state(state["rng"])


# --- staging and files --------------------------------------------------------------------------------


def stage_to_host(obj: Any, buffers: dict[tuple, torch.Tensor] | None = None, path: tuple = ()) -> Any:
    """A deep copy with every tensor copied to CPU memory (DTensors keep mesh and placements).

    After this returns the caller may mutate or free the originals: the copy shares nothing with them.
    `buffers` (kept by the caller across saves) holds the host tensors of the previous save; reusing
    them turns the stall from allocate-and-copy into copy only (allocating ~150 MB costs ~5x the copy).
    Only safe when the previous save has finished writing, which CheckpointManager guarantees.
    """
    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        if buffers is None or type(src) is not torch.Tensor:  # DTensor and subclasses: plain copy
            return src.to("cpu", copy=True)
        buf = buffers.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=torch.cuda.is_available())
            buffers[path] = buf
        buf.copy_(src, non_blocking=False)
        return buf
    if isinstance(obj, dict):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for key, value in obj.items():
            out[key] = stage_to_host(value, buffers, (*path, key))
        if hasattr(obj, "_metadata"):  # module state dicts carry per-module versions here
            out._metadata = copy.deepcopy(obj._metadata)  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list):
        return [stage_to_host(v, buffers, (*path, i)) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(stage_to_host(v, buffers, (*path, i)) for i, v in enumerate(obj))
    return copy.deepcopy(obj)


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


def dcp_load_full(folder: Path) -> dict[str, Any]:
    """Every tensor of a DCP folder as full (unsharded) tensors, in this process alone."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    buffer_path = folder.parent / (folder.name + ".full.pt")
    dcp_to_torch_save(str(folder), str(buffer_path))
    try:
        return torch.load(buffer_path, map_location="cpu", weights_only=True)
    finally:
        buffer_path.unlink(missing_ok=True)


def sharded_template(model: torch.nn.Module, optimizers: Iterable[torch.optim.Optimizer],
                     weights_only: bool) -> dict[str, Any]:
    """The state dicts DCP loads into: the current model's (and optimizers') own layout."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    inner = unwrap_model(model)
    template: dict[str, Any] = {"model": get_model_state_dict(inner)}
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
        full = dcp_load_full(local / DCP_DIR)
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
