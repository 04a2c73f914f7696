"""Where a reader process's time goes, per stage; set TESSERA_STREAM_PROFILE=1 to print it.

Kept apart from the dataset so the training process (which gathers batches its DataLoader workers
name) and the workers count their time the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class StageTimes:
    """Seconds spent per stage in this reader process; set TESSERA_STREAM_PROFILE=1 to print them."""

    wait: float = 0.0  # blocked on a shard (download not finished, or opening it)
    decode: float = 0.0  # decoding samples (includes time the consumer held the generator)

    def report(self, streams: list[Any]) -> str:
        dl = sum(st.cache.stats.download_seconds for st in streams)
        dz = sum(st.cache.stats.decompress_seconds for st in streams)
        got = sum(st.cache.stats.bytes_downloaded for st in streams)
        ev = sum(st.cache.space.evictions for st in streams)
        return (f"download {dl:.2f}s ({got / 1e6:.1f} MB), decompress {dz:.2f}s, wait {self.wait:.2f}s, "
                f"decode+consume {self.decode:.2f}s, evictions {ev}")

    def reset(self) -> None:
        """Start counting afresh (the loader's training process, after each epoch)."""
        self.wait = self.decode = 0.0
