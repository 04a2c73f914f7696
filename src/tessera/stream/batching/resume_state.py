"""The resume state of a stream: what `state_dict()` saves and how `load_state_dict()` checks it.

The state is small and topology-free: the plan's fingerprint, the epoch, the samples consumed in it
(over all ranks) and the settings that define the order. It says nothing about ranks or workers,
which is why it loads on any world size. This module is its one definition: the dict's keys, the
`PlanState` they hold, the checks that refuse a state from another dataset or other settings, and the
reading of MosaicML Streaming's state (`epoch`, `sample_in_epoch`, ...).

Saved dicts must keep loading across versions: keys are only ever added, and `PlanState.from_dict`
ignores keys it does not know.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tessera.stream.batching.epoch_plan import PLAN_VERSION, EpochPlan, PlanConfig, RunPlan

STATE_FORMAT = "tessera.stream/1"


class PlanStateMismatch(ValueError):
    """A resume state does not belong to this plan (other dataset, weights or shuffle settings)."""


@dataclass(frozen=True)
class PlanState:
    """Topology-free resume state: enough to rebuild S and continue it at `samples_consumed`."""

    fingerprint: str
    epoch: int
    samples_consumed: int
    seed: int
    num_lanes: int
    block_size: int
    shuffle: bool
    shuffle_algo: str
    sampling_method: str
    epoch_size: int | None
    version: int = PLAN_VERSION

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PlanState:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - set(data) - {"version"}
        if missing:
            raise ValueError(f"plan state is missing {sorted(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})


def plan_state(plan: EpochPlan, samples_consumed: int) -> PlanState:
    """Resume state after the first `samples_consumed` positions of `plan`'s S (any layout may resume it)."""
    if not 0 <= samples_consumed <= len(plan):
        raise ValueError(f"samples_consumed={samples_consumed} is outside the epoch of {len(plan)} samples")
    run, cfg = plan.run, plan.run.config
    return PlanState(fingerprint=run.fingerprint, epoch=plan.epoch, samples_consumed=int(samples_consumed),
                     seed=cfg.seed, num_lanes=cfg.num_lanes, block_size=cfg.block_size, shuffle=cfg.shuffle,
                     shuffle_algo=cfg.algo, sampling_method=cfg.sampling_method, epoch_size=cfg.epoch_size)


def check_plan_state(run: RunPlan, state: PlanState) -> None:
    """Raise `PlanStateMismatch` naming the first setting in which `state` differs from `run`."""
    c = run.config
    ours = {"version": PLAN_VERSION, "seed": c.seed, "num_lanes": c.num_lanes, "block_size": c.block_size,
            "shuffle": c.shuffle, "shuffle_algo": c.algo, "sampling_method": c.sampling_method,
            "epoch_size": c.epoch_size, "fingerprint": run.fingerprint}
    for name, value in ours.items():
        theirs = getattr(state, name)
        if theirs != value:
            raise PlanStateMismatch(
                f"resume state has {name}={theirs!r} but this run has {value!r}: the checkpoint was taken "
                "with another dataset or other stream/shuffle settings; restore those or start a new epoch")


def resume_plan(run: RunPlan, state: PlanState) -> EpochPlan:
    """The epoch plan `state` continues, once it is known to belong to `run`."""
    check_plan_state(run, state)
    return run.epoch(state.epoch)


def resume_unit(method: str, global_batch_size: int, device_batch_size: int) -> int:
    """Samples consumed must be a multiple of this to resume: a global batch, or a device batch for
    device_per_stream (whose device-batch sequence does not depend on the world size)."""
    return device_batch_size if method == "device_per_stream" else global_batch_size


def save_state(run: RunPlan, epoch: int, consumed: int, epoch_samples: int, method: str,
               global_batch_size: int, device_batch_size: int) -> dict[str, Any]:
    """The dict `StreamingDataset.state_dict()` returns; it also carries MosaicML's key names.

    `consumed` (over all ranks) is capped at `epoch_samples`: the wrapped tail of the last global batch
    counts as the end of the epoch. Batching methods other than "random" resume only at their batch
    grid (`resume_unit`), and their state names it.
    """
    consumed = min(consumed, epoch_samples)
    if method == "random":
        return {**_plan_keys(run, epoch, consumed), "batching_method": "random"}
    unit = resume_unit(method, global_batch_size, device_batch_size)
    if consumed % unit:
        raise ValueError(f"batching_method={method!r} resumes at global batch boundaries: "
                         f"{consumed} samples is not a multiple of {unit} (global batch size {global_batch_size})")
    return {**_plan_keys(run, epoch, 0), "samples_consumed": consumed, "sample_in_epoch": consumed,
            "batching_method": method, "global_batch_size": global_batch_size,
            "device_batch_size": device_batch_size}


def _plan_keys(run: RunPlan, epoch: int, consumed: int) -> dict[str, Any]:
    state = plan_state(run.epoch(epoch), consumed).to_dict()
    return {**state, "format": STATE_FORMAT, "sample_in_epoch": consumed,
            "num_canonical_nodes": state["num_lanes"], "shuffle_seed": state["seed"]}


def read_state(obj: dict[str, Any], config: PlanConfig) -> PlanState:
    """A PlanState from our own state, or from a MosaicML Streaming state (epoch, sample_in_epoch, ...)."""
    if not isinstance(obj, dict):
        raise TypeError(f"a stream state must be a dict, got {type(obj).__name__}")
    if obj.get("format") == STATE_FORMAT:
        return PlanState.from_dict(obj)
    missing = {"epoch", "sample_in_epoch"} - set(obj)
    if missing:
        raise ValueError(f"not a stream state: missing {sorted(missing)}")
    # A MosaicML Streaming state: same dataset, our plan with its lane count and seed.
    lanes = obj.get("num_canonical_nodes") or config.num_lanes
    seed = obj.get("shuffle_seed", config.seed)
    if seed != config.seed:
        raise ValueError(f"state was saved with shuffle_seed={seed}, dataset has {config.seed}")
    epoch, consumed = int(obj["epoch"]), int(obj["sample_in_epoch"])
    if epoch < 0:  # MosaicML's state from before its first epoch began (its epoch counter is then -1)
        epoch, consumed = 0, 0
    return PlanState(fingerprint="", epoch=epoch, samples_consumed=consumed,
                     seed=seed, num_lanes=int(lanes), block_size=config.block_size, shuffle=config.shuffle,
                     shuffle_algo=config.algo, sampling_method=config.sampling_method,
                     epoch_size=config.epoch_size)


def check_batching(obj: dict[str, Any], method: str, global_batch_size: int, device_batch_size: int) -> None:
    """Refuse (PlanStateMismatch) a state saved with another batching method or another batch grid:
    stratified and per_stream need the same global batch size, device_per_stream the same per-device
    batch size (any world size). A state without the key is taken as this run's method (MosaicML's)
    or, for our own older states, as "random"."""
    saved = obj.get("batching_method", "random" if obj.get("format") else method)
    if saved != method:
        raise PlanStateMismatch(f"resume state has batching_method={saved!r} but this run has {method!r}")
    if method == "random":
        return
    key, ours = (("device_batch_size", device_batch_size) if method == "device_per_stream"
                 else ("global_batch_size", global_batch_size))
    theirs = obj.get(key, ours)
    if theirs != ours:
        raise PlanStateMismatch(f"resume state has {key}={theirs} but this run has {ours}: "
                                f"batching_method={method!r} resumes only with the same {key}")


def resumed_config(state: PlanState, config: PlanConfig) -> PlanConfig:
    """`config` with the lane count and block size `state` was saved with (S depends on both), or
    `config` itself when they agree."""
    if state.num_lanes == config.num_lanes and state.block_size == config.block_size:
        return config
    return PlanConfig(**{**config.__dict__, "num_lanes": state.num_lanes, "shuffle_block_size": state.block_size})


def checked_state(run: RunPlan, state: PlanState) -> PlanState:
    """`state`, checked against `run`; a MosaicML state (no fingerprint) is taken to be of the same data."""
    if not state.fingerprint:
        state = dataclasses.replace(state, fingerprint=run.fingerprint)
    check_plan_state(run, state)
    return state
