"""Worker pools for the dataset tools (`inspect`, `verify`): chunks of an index checked in parallel.

Checking a shard is mostly Python (opening, parsing headers, decoding samples), so threads would take
turns on one core: the pool is of processes, started as `convert` starts its own (`start_method`: fork
when it is safe, else spawn without re-importing the caller's main script). A caller that holds a
`Store` object rather than a URL gets threads, which share it (stores do not cross processes).
Results come back in submission order with a bounded number of chunks in flight, so the memory of a
half-million-shard run stays that of a few chunks, and the report reads in shard order.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, TypeVar

from tessera.shards.convert import _spawn_without_main, start_method

R = TypeVar("R")
AHEAD_PER_WORKER = 3  # chunks in flight per worker: one running, the next ones queued
CHECK_MIN_SHARDS = 512  # a dataset with fewer shards is checked in this process


def auto_workers(workers: int | None, count: int, minimum: int) -> int:
    """`workers` as given; None: one per CPU for `count` items of at least `minimum`, else 1 (starting
    processes takes about a second, longer than checking a small dataset)."""
    if workers is not None:
        return max(1, workers)
    return (os.cpu_count() or 1) if count >= minimum else 1


def _started() -> None:
    """A worker's first task: makes the pool start every process at once."""


@contextlib.contextmanager
def worker_pool(workers: int, threads: bool = False) -> Iterator[Executor | None]:
    """`workers` processes (threads with `threads`), all started; None for one worker (run in line)."""
    if workers <= 1:
        yield None
        return
    if threads:
        with ThreadPoolExecutor(workers, thread_name_prefix="tessera-check") as pool:
            yield pool
        return
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context(start_method()))
    try:
        with _spawn_without_main():
            for future in [pool.submit(_started) for _ in range(workers)]:
                future.result()
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def ordered_map(pool: Executor | None, fn: Callable[..., R], jobs: Iterable[tuple[Any, ...]],
                ahead: int) -> Iterator[R]:
    """`fn(*job)` for each job, in order; at most `ahead` jobs submitted and not yet consumed.
    In line (no pool) when `pool` is None. Stopping the iteration cancels what was not started."""
    if pool is None:
        yield from (fn(*job) for job in jobs)
        return
    pending: deque[Future[R]] = deque()
    try:
        for job in jobs:
            pending.append(pool.submit(fn, *job))
            if len(pending) >= max(1, ahead):
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
