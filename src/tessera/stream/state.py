"""Resume state of a StreamingDataset, and the per-stage time breakdown users can turn on.

The state is small and topology-free: the plan's fingerprint, the epoch, the samples consumed in it
(over all ranks) and the settings that define the order. It says nothing about ranks or workers,
which is why it loads on any world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera.stream.plan import PlanConfig, PlanState, RunPlan

STATE_FORMAT = "tessera.stream/1"


def make_state(run: RunPlan, epoch: int, consumed: int) -> dict[str, Any]:
    """The dict `state_dict()` returns; also carries MosaicML's key names for familiarity."""
    state = run.epoch(epoch).state(consumed).to_dict()
    return {**state, "format": STATE_FORMAT, "sample_in_epoch": consumed,
            "num_canonical_nodes": state["num_lanes"], "shuffle_seed": state["seed"]}


def check_resume_state(obj: dict[str, Any], config: PlanConfig) -> PlanState:
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


@dataclass
class StageTimes:
    """Seconds spent per stage in this reader process; set TESSERA_STREAM_PROFILE=1 to print them."""

    wait: float = 0.0  # blocked on a shard (download not finished, or opening it)
    decode: float = 0.0  # decoding samples (includes time the consumer held the generator)

    def report(self, streams: list[Any]) -> str:
        dl = sum(st.cache.stats.download_seconds for st in streams)
        dz = sum(st.cache.stats.decompress_seconds for st in streams)
        got = sum(st.cache.stats.bytes_downloaded for st in streams)
        ev = sum(st.cache.stats.evictions for st in streams)
        return (f"download {dl:.2f}s ({got / 1e6:.1f} MB), decompress {dz:.2f}s, wait {self.wait:.2f}s, "
                f"decode+consume {self.decode:.2f}s, evictions {ev}")
