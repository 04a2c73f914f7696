"""What goes in a checkpoint: the state dict of a run, captured from live objects and applied back.

State dict (what `capture_state` builds, `CheckpointManager.save` writes and `load` returns):

    {"model": state_dict, "optimizers": [state_dict, ...], "schedulers": [state_dict, ...],
     "scaler": state_dict | None, "timestamp": Timestamp.state_dict(), "rng": capture_rng_state(),
     "dataloader": any picklable value, "config": JSON-able dict, "sharded": bool}

Non-sharded states hold ordinary `module.state_dict()` / `optimizer.state_dict()` (DDP wrappers are
unwrapped, so a checkpoint from 4 DDP ranks loads into a bare model). Sharded states hold DCP's
`get_model_state_dict` / `get_optimizer_state_dict` forms (DTensor shards, optimizer state keyed by
parameter name), which DCP reshards to any world size on load. `stage_to_host` is the copy a save
takes before it returns, so the loop may change the live tensors while the save is written.

Trainable-only: a model that sets `checkpoint_trainable_only = True` (LoRA models do: llm/hf/lora.py)
declares that its frozen parameters can be rebuilt the way they were built the first time (from the
pretrained folder, or from the seed). Then "model" holds only the parameters that train, and the
optimizers hold state for those alone, so a LoRA checkpoint is the size of its adapters; `apply_state`
loads the saved part and checks that every trainable parameter was in it. Any other model is saved
whole, frozen parameters included (frozen after a `load_path` start, say, they could not be rebuilt).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from tessera.train.checkpoint.rng import capture_rng_state, restore_rng_state
from tessera.train.time import Timestamp

STEP_KERNEL_KEYS = ("fused", "foreach", "capturable")  # how an optimizer's step runs, not what it computes


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


def saves_trainable_only(model: torch.nn.Module) -> bool:
    """Whether the model's checkpoints leave its frozen parameters out (module docstring)."""
    inner = unwrap_model(model)
    return bool(getattr(inner, "checkpoint_trainable_only", False)) and any(
        not p.requires_grad for p in inner.parameters())


def trainable_names(model: torch.nn.Module) -> set[str]:
    return {name for name, p in unwrap_model(model).named_parameters() if p.requires_grad}


def model_state(model: torch.nn.Module, sharded: bool) -> dict[str, Any]:
    """The model's part of a checkpoint: every entry, or only the trainable parameters if some are frozen."""
    inner = unwrap_model(model)
    frozen = saves_trainable_only(inner)
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(inner, options=StateDictOptions(ignore_frozen_params=frozen))
    state = inner.state_dict()
    if not frozen:
        return state
    keep = trainable_names(inner)
    return OrderedDict((key, value) for key, value in state.items() if key in keep)


def check_trainable_state(model: torch.nn.Module, saved: dict[str, Any]) -> None:
    """A trainable-only state must hold every trainable parameter of `model`, and nothing it lacks."""
    inner = unwrap_model(model)
    missing = sorted(trainable_names(inner) - set(saved))
    unexpected = sorted(set(saved) - set(inner.state_dict()))
    if missing or unexpected:
        raise ValueError("the checkpoint does not match the model's trainable parameters: "
                         + (f"missing {missing[:5]}" if missing else "") + (" " if missing and unexpected else "")
                         + (f"unexpected {unexpected[:5]}" if unexpected else "")
                         + " (was it saved with other LoRA settings or another model?)")


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
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        inner = unwrap_model(model)
        optim_states = [get_optimizer_state_dict(inner, opt) for opt in optimizers]
    else:
        optim_states = [opt.state_dict() for opt in optimizers]
    return {"model": model_state(model, sharded), "optimizers": optim_states,
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
        partial = saves_trainable_only(inner) and set(state["model"]) != set(inner.state_dict())
        if partial and strict:
            check_trainable_state(inner, state["model"])
        if sharded or is_sharded_model(inner):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            full = not has_dtensor(state["model"])
            set_model_state_dict(inner, state["model"],
                                 options=StateDictOptions(strict=strict and not partial, full_state_dict=full))
        else:
            inner.load_state_dict(state["model"], strict=strict and not partial)
    for opt, opt_state in _pairs(optimizers, state.get("optimizers"), "optimizer"):
        if sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            full = not has_dtensor(opt_state)
            set_optimizer_state_dict(unwrap_model(model), opt, with_live_kernels(opt, opt_state),
                                     options=StateDictOptions(strict=strict, full_state_dict=full))
        else:
            opt.load_state_dict(with_live_kernels(opt, opt_state))
    for sched, sched_state in _pairs(schedulers, state.get("schedulers"), "scheduler"):
        sched.load_state_dict(sched_state)
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    if restore_rng and state.get("rng") is not None:
        restore_rng_state(state["rng"])


def with_live_kernels(opt: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """`saved` (an optimizer state dict) with the live optimizer's fused/foreach/capturable in its param
    groups: the saved groups bring their hyperparameters, but how the step runs stays this process's
    choice. torch takes a saved group whole, so a state saved on a CPU (fused=None) would switch a GPU run's
    fused Adam off (the optimizer still declaring amp scaling, which an unfused step refuses), and a GPU's
    fused=True would follow a state onto a CPU. Set before loading, so torch places the step counts where
    the live kernel wants them."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or len(groups) != len(opt.param_groups):  # torch's load names the mismatch
        return saved
    live = [{key: group[key] for key in STEP_KERNEL_KEYS if key in group} for group in opt.param_groups]
    return {**saved, "param_groups": [{**group, **kernels} for group, kernels in zip(groups, live, strict=True)]}


def _pairs(live: list[Any], saved: list[Any] | None, what: str) -> list[tuple[Any, Any]]:
    """Each live object with its saved state; none when either side is empty (a weights-only load, or
    nothing passed to restore), an error when both are given and their counts differ."""
    if not live or not saved:
        return []
    if len(saved) != len(live):
        raise ValueError(f"the checkpoint has {len(saved)} {what} state(s), but {len(live)} {what}(s) were given")
    return list(zip(live, saved, strict=True))


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
