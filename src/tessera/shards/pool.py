"""Worker pools for the dataset tools (`inspect`, `verify`): chunks of an index checked in parallel.

Checking a shard is mostly Python (opening, parsing headers, decoding samples), so threads would take
turns on one core: the pool is of processes, started as `convert` starts its own (both use `start_method`:
fork when it is safe, else spawn; and `spawn_without_main`: no re-import of the caller's main script).
A caller that holds a `Store` object rather than a URL gets threads, which share it (stores do not cross
processes).
Results come back in submission order with a bounded number of chunks in flight, so the memory of a
half-million-shard run stays that of a few chunks, and the report reads in shard order.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, TypeVar

from tessera.storage.fork_gate import requests_made

R = TypeVar("R")
AHEAD_PER_WORKER = 3  # chunks in flight per worker: one running, the next ones queued
CHECK_MIN_SHARDS = 512  # a dataset with fewer shards is checked in this process


def auto_workers(workers: int | None, count: int, minimum: int) -> int:
    """`workers` as given; None: one per CPU for `count` items of at least `minimum`, else 1 (starting
    processes takes about a second, longer than checking a small dataset)."""
    if workers is not None:
        return max(1, workers)
    return (os.cpu_count() or 1) if count >= minimum else 1


@contextlib.contextmanager
def spawn_without_main() -> Iterator[None]:
    """Start worker processes without re-importing the caller's main script.

    Spawned children import the parent's `__main__` first; workers only run tessera code, and the
    `tessera` CLI's script imports every command (torch included, seconds per worker). So while processes
    start, `__main__` shows neither `__file__` nor `__spec__`, which is how spawn decides to skip it."""
    main = sys.modules.get("__main__")
    saved = {key: main.__dict__[key] for key in ("__file__", "__spec__") if main and key in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def start_method() -> str:
    """How worker processes start: "fork" when this process runs no other thread, else "spawn".

    A forked worker is ready in milliseconds with everything imported; a spawned one needs about half a
    second of CPU (interpreter, numpy, pyarrow), as long as encoding several chunks. Forking is only safe
    while no other thread can hold a lock the child would need: `convert` forks before it starts its own
    threads (the uploader), and only if the caller runs none (numpy and Arrow handle fork themselves).
    From Python 3.12 on, native threads count too, as they do for its fork warning. Nor once this process
    has made an object-store request (listing a bucket input): obstore's runtime would hang in the child."""
    if "fork" not in mp.get_all_start_methods() or threading.active_count() > 1 or requests_made():
        return "spawn"
    if sys.version_info >= (3, 12) and _os_threads() != 1:
        return "spawn"
    return "fork"


def _os_threads() -> int:
    try:
        with open("/proc/self/stat") as stat:
            return int(stat.read().rpartition(")")[2].split()[17])
    except (OSError, ValueError, IndexError):
        return 0


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
        with spawn_without_main():
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
