"""Which sample goes where and when: deterministic, elastic, resumable streaming of MDS shards.

`StreamingDataset` and `StreamingDataLoader` use MosaicML Streaming's parameter names; see
docs/streaming.md for the differences.

- `StreamingDataset(remote=..., local=..., streams=[Stream(...)], ...)`, `StreamingDataLoader(dataset)`:
  the same global batches on any layout; `state_dict` / `load_state_dict` resume on any world size, and
  a state that cannot apply to this run raises `PlanStateMismatch`.
- The local cache: `cache_limit` bounds it by evicting shards (`CacheLimitError` when it is below what
  the run needs);
  `download_counts(local)` reads its download journal.
- `streams_registry`: `Stream` subclasses by name, for `stream_name` / `stream_config`.
- `clean_stale_shared_memory()`: MosaicML's, a no-op (Tessera leaves nothing in /dev/shm); `generate_work(...)`:
  MosaicML's array of the samples each worker of a given world reads in an epoch.

The sample order itself is pure functions in `tessera.stream.batching` (import from its modules).
"""

from tessera.stream.batching.resume_state import PlanStateMismatch
from tessera.stream.cache import download_counts
from tessera.stream.cache_limit import CacheLimitError
from tessera.stream.dataset import StreamingDataset
from tessera.stream.loader import StreamingDataLoader
from tessera.stream.mosaic_api import clean_stale_shared_memory, generate_work
from tessera.stream.registry import streams_registry
from tessera.stream.streams import Stream

__all__ = ["CacheLimitError", "PlanStateMismatch", "Stream", "StreamingDataLoader", "StreamingDataset",
           "clean_stale_shared_memory", "download_counts", "generate_work", "streams_registry"]
