"""Download shards ahead of the reader, in the order the epoch plan says they will be needed.

The plan knows the future exactly, so prefetching is not a guess: a background thread walks the
worker's upcoming shard needs and keeps up to `window` samples ahead of the reader with several
concurrent downloads. The same knowledge ranks shards for eviction (needed last goes first).

The first window is different: nothing is present yet, and a shuffled epoch's first batch needs a
shard of nearly every lane's block at once (all of them, for a block as large as the dataset). Those
fetches (up to FIRST_FETCHES) are submitted in the constructor, in need order, before the reader's first
step (`first_window`): the reader then waits on each shard's fetch instead of starting a download of its
own that a prefetch thread waited behind (one of the pool's slots lost at the start of every epoch).
They run `concurrency` at a time, as later ones do: starting all of them at once (16 downloads of 4
ranges each per DataLoader worker) made a cold shuffled first batch later, not sooner, on 2 cores
(benchmarks/RESULTS.md, issue 24).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tessera.stream.batching.shard_needs import ShardNeed

FIRST_FETCHES = 16  # fetches of the first window submitted by the constructor, at most


def first_window(needs: Iterator[ShardNeed], window: int,
                 limit: int) -> tuple[list[ShardNeed], Iterator[ShardNeed]]:
    """The needs of the first `window` samples (up to `limit` of them), and the needs that follow."""
    first: list[ShardNeed] = []
    for need in needs:
        if need.sample_index > window or len(first) == limit:
            return first, itertools.chain([need], needs)
        first.append(need)
    return first, needs


class Prefetcher:
    """Fetch shards from `needs` (in order) while they are within `window` samples of the reader."""

    def __init__(self, needs: Iterator[ShardNeed],
                 fetch: Callable[[int, Callable[[Path], float]], Path | None],
                 path_of: Callable[[int], Path], window: int, concurrency: int = 4,
                 warm_up: Callable[[], object] | None = None, in_order: bool = False) -> None:
        self._needs = needs
        self._fetch = fetch
        self._path_of = path_of
        self._window = max(1, window)
        self._cond = threading.Condition()
        self._position = 0  # samples the reader has consumed
        self._wake_at = math.inf  # the planning thread waits until _position + window reaches this
        self._stopped = False
        # shard file -> sample indices of its coming needs (first need; with a cache limit also each later
        # batch's first use of it: `BatchSchedule.shard_order(renew=...)`), oldest first
        self._next_need: dict[Path, deque[int]] = {}
        self._started: set[int] = set()  # shards whose fetch was submitted at least once
        self._futures: dict[int, Future[Path | None]] = {}
        # Under a cache limit, fetches run one at a time in need order, and one that found no room is retried
        # as the reader moves on (`_settle`): concurrent or skipped-ahead prefetches let a later shard take
        # the room of an earlier one, which then evicted it again (downloaded twice). A shard's download is
        # itself parallel (ranged GETs), so one at a time still keeps the link busy.
        self._in_order = in_order
        first: list[ShardNeed] = []
        if not in_order:  # started now, before the reader's first step (see the module doc)
            first, self._needs = first_window(needs, self._window, FIRST_FETCHES)
        self._pool = ThreadPoolExecutor(max_workers=1 if in_order else concurrency,
                                        thread_name_prefix="tessera-prefetch")
        for need in first:
            self._start(need, self._path_of(need.shard))
        if warm_up is not None:  # one-time set-up the reader needs later, done while the downloads run
            self._pool.submit(warm_up)
        self._thread = threading.Thread(target=self._run, name="tessera-prefetch-plan", daemon=True)
        self._thread.start()

    def advance(self, position: int) -> None:
        """The reader has consumed `position` samples; the prefetcher may move further ahead.

        Called once per batch (thousands of times a second), so the planning thread is woken only when
        its next need comes within the window: waking it for every batch cost a thread switch each.
        `_position` is written before `_wake_at` is read, and the thread sets `_wake_at` before it reads
        `_position` (both under the GIL), so one of the two always sees the other's update.
        """
        if position <= self._position:
            return
        self._position = position
        if position + self._window >= self._wake_at:
            with self._cond:
                self._cond.notify_all()

    def rank(self, path: Path) -> float:
        """Eviction rank of a cached file: how far in the future it is next needed, as far as the planning
        thread has looked (up to `window` samples ahead); inf when no need is known.

        Ranking by the *first* need alone treated a shard that the next batch needs again as unneeded,
        so under a cache limit it was evicted and downloaded again batch after batch.
        """
        needs = self._next_need.get(path)
        while needs:
            try:
                if needs[0] >= self._position:
                    return float(needs[0] - self._position)
                needs.popleft()
            except IndexError:  # emptied by another thread meanwhile
                break
        return math.inf

    def wait_for(self, shard: int) -> Path | None:
        """Block on the prefetch of `shard` if one is running; None if it was never started or skipped
        (no room under cache_limit). The path is only a hint: the shard may be evicted until pinned."""
        future = self._futures.get(shard)
        return future.result() if future is not None else None

    def pending(self, shard: int) -> bool:
        """Whether this prefetcher has not finished fetching `shard` (not yet started, queued, or waiting
        for another process's download of it): ranged reads may serve its samples meanwhile (ranged.py)."""
        future = self._futures.get(shard)
        return future is None or not future.done()

    def _run(self) -> None:
        for need in self._needs:
            with self._cond:
                self._wake_at = need.sample_index
                while not self._stopped and need.sample_index > self._position + self._window:
                    self._cond.wait(timeout=1.0)
                self._wake_at = math.inf
                if self._stopped:
                    return
                path = self._path_of(need.shard)
            future = self._futures.get(need.shard)
            if need.shard not in self._started or (future is None or future.done()) and not path.exists():
                # first need, or needed again after its eviction
                if self._in_order and not self._settle(need, self._start(need, path)):
                    return
            else:
                self._next_need.setdefault(path, deque()).append(need.sample_index)
            self._forget_done()

    def _start(self, need: ShardNeed, path: Path) -> Future[Path | None]:
        """Submit the fetch of `need`'s shard, noting the need for eviction ranks."""
        self._next_need.setdefault(path, deque()).append(need.sample_index)
        self._started.add(need.shard)
        future = self._futures[need.shard] = self._pool.submit(self._fetch, need.shard, self.rank)
        return future

    def _settle(self, need: ShardNeed, future: Future[Path | None]) -> bool:
        """In-order mode: wait for this fetch; while it finds no room under the cache limit, retry each time
        the reader moves on (it frees room as it finishes shards), until fetched or the reader has reached
        the shard itself (its own fetch then proceeds). False once stopped."""
        while True:
            try:
                if future.result() is not None:
                    return True
            except BaseException:  # the reader sees the error in wait_for
                return not self._stopped
            with self._cond:
                self._wake_at = -math.inf  # any advance wakes this thread
                seen = self._position
                while not self._stopped and self._position == seen:
                    self._cond.wait(timeout=0.2)
                self._wake_at = math.inf
                if self._stopped:
                    return False
                if need.sample_index < self._position:
                    return True
            future = self._futures[need.shard] = self._pool.submit(self._fetch, need.shard, self.rank)

    def _forget_done(self) -> None:
        """Drop finished futures and passed needs, so memory stays O(window)."""
        if len(self._futures) >= 256:
            for shard, future in list(self._futures.items()):
                if future.done():
                    del self._futures[shard]
        if len(self._next_need) >= 1024:
            for path in [p for p, needs in self._next_need.items() if self.rank(p) == math.inf]:
                del self._next_need[path]

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._pool.shutdown(wait=True, cancel_futures=True)


class NoPrefetch(Prefetcher):
    """A Prefetcher for a reader with nothing to download (every stream local-only): the shard order a
    Prefetcher walks costs a plan computation per sample (about a third of a DataLoader worker's CPU on
    a local dataset) for nothing, and local-only folders are never evicted from. No thread, no pool."""

    def __init__(self) -> None:  # noqa: D107 - nothing to set up (the parent's state is never used)
        pass

    def advance(self, position: int) -> None:
        """Nothing to keep ahead of."""

    def rank(self, path: Path) -> float:
        return math.inf

    def wait_for(self, shard: int) -> Path | None:
        return None

    def pending(self, shard: int) -> bool:
        return False

    def close(self) -> None:
        """No thread to stop."""
