"""Which sample goes where and when: deterministic, elastic, resumable streaming of MDS shards.

`StreamingDataset` and `StreamingDataLoader` use MosaicML Streaming's parameter names; see
docs/streaming.md for the differences. The order itself is a pure function (`plan`, `schedule`).
"""

from tessera.stream.batching.epoch_plan import EpochPlan, PlanConfig, RunPlan
from tessera.stream.batching.resume_state import PlanState, PlanStateMismatch
from tessera.stream.cache import CacheLimitError, ShardCache, download_counts
from tessera.stream.dataset import StreamingDataset
from tessera.stream.loader import StreamingDataLoader
from tessera.stream.registry import streams_registry
from tessera.stream.streams import Stream
from tessera.stream.world import World

__all__ = ["CacheLimitError", "EpochPlan", "PlanConfig", "PlanState", "PlanStateMismatch", "RunPlan",
           "ShardCache", "Stream", "StreamingDataLoader", "StreamingDataset", "World",
           "download_counts", "streams_registry"]
