"""The train dataloader across epochs: where an epoch ends, and when a resumed run's RNG state is set.

An epoch ends after `len(loader)` batches when the loader has a length (then the iterator is run to
its end at once, so the loader is already in the next epoch when a checkpoint of that step captures its
state), else when the iterator is exhausted.

A DataLoader draws seeds from torch's RNG when its iterator starts (at iter() or at the first next()).
A checkpoint taken at an epoch end is captured before the next epoch's iterator starts; one taken
mid-epoch after that start. So a resumed run sets the saved RNG state right after iter() in the first
case, and right after the resumed iterator's first batch in the second: both runs then draw the same
numbers in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tessera.train.checkpoint.rng import restore_rng_state

END = object()  # what `next_batch` returns when the loader is exhausted


def loader_length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


class EpochIterator:
    """Batches of `loader`, epoch after epoch; `rng_state` is a resumed checkpoint's, set at the right point."""

    def __init__(self, loader: Any, batch_in_epoch: int = 0, rng_state: dict[str, Any] | None = None) -> None:
        self.loader = loader
        self._rng_state = rng_state
        self.length: int | None = None
        self._batches: Iterator[Any] = iter(())
        self.open(batch_in_epoch)

    def open(self, batch_in_epoch: int = 0) -> None:
        """Start iterating the loader (for the epoch it is in)."""
        self.length = loader_length(self.loader)
        self._batches = iter(self.loader)
        if batch_in_epoch == 0:
            self._restore_rng()

    def next_batch(self) -> Any:
        """The next batch of this epoch, or END when the loader is exhausted."""
        batch = next(self._batches, END)
        self._restore_rng()  # no-op unless resuming mid-epoch
        return batch

    def epoch_done(self, batch_in_epoch: int) -> bool:
        """Whether the batch just taken was the epoch's last by the loader's length (the iterator is then
        finished, so the loader moves on to the next epoch)."""
        if self.length is None or batch_in_epoch < self.length:
            return False
        if next(self._batches, END) is not END:
            raise RuntimeError(f"train_dataloader yielded more than len() = {self.length} batches in an epoch")
        return True

    def _restore_rng(self) -> None:
        if self._rng_state is not None:
            restore_rng_state(self._rng_state)
            self._rng_state = None
