"""How much of the machine a background save may take from the training loop.

A save's background work (torch.save / DCP writes, xxh64 hashing, uploads) competes with the loop for
the same cores. On a node with few cores per rank, an unbounded writer (one upload thread per file, at
the loop's own priority) makes the steps right after a save visibly slower, which is the stall the
async save exists to avoid. Two bounds, both per rank:

- upload concurrency: one upload thread when the machine has at most 2 cores per local rank, more
  (up to 4) only where cores are to spare. Loopback and local-disk uploads are CPU-bound, so more
  threads only take more CPU; a remote bucket benefits from concurrency, which large machines get.
- priority: the save thread and its upload threads lower their own nice value (Linux threads are
  scheduled one by one, so only the writer threads are affected, never the loop or its intra-op
  pool). Under contention the kernel then gives the loop the core first; when the loop waits (on
  a collective or the GPU) the writer runs at full speed. Where per-thread priority does not exist
  (macOS, Windows) nothing happens.

No compression is applied to checkpoint files (they are mostly incompressible floats), so there is no
compression level to bound. benchmarks/checkpoint_stall.py measures the effect (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from tessera.train.cpu_threads import available_cores, local_ranks

log = logging.getLogger(__name__)

WRITER_NICE = 10   # added to the writer threads' nice value; 19 is the lowest priority


def default_upload_threads() -> int:
    """1 with at most 2 cores per local rank; then one more per 4 spare cores, at most 4."""
    per_rank = available_cores() // local_ranks()
    return 1 if per_rank <= 2 else min(4, 1 + (per_rank - 2) // 4)


def lower_thread_priority(nice: int = WRITER_NICE) -> None:
    """Set the calling thread's nice value to the process's (its main thread's) plus `nice` (Linux: per
    thread). Threads it starts inherit it, and calling it again there changes nothing. Errors are only
    logged: a save must never fail because its priority could not be lowered."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        target = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + nice)
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except (AttributeError, OSError) as exc:
        log.debug("could not lower the checkpoint writer's priority: %s", exc)
