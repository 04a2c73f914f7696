"""Fewer torch threads when the CPU is already busy.

torch's intra-op pool starts one thread per core and its threads wait for each other at every operator.
When other processes hold the cores, each operator waits for the slowest thread to be scheduled again,
and a CPU step becomes 8-14x slower than with a single thread. So a CPU run that starts on an
oversubscribed machine (the 1-minute load average above the cores this process may use, by a margin)
drops to one thread and says so once, unless the user chose a thread count.

The count is part of a run's arithmetic: CPU reductions (a layer norm's sums, say) split their work by
thread and add the parts in another order with another count. So the count is decided at a run's first
start, saved in its checkpoints, and a resumed run takes it again (`threads_for_resume`), whatever the load
is then: that is what keeps a resumed CPU run bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def overload_margin(cores: int) -> float:
    """How far the load may exceed the cores before we act: a just-finished data prep or one other job
    lifts the 1-minute average for a while without starving torch's threads."""
    return max(1.0, 0.5 * cores)


def threads_for_load(load: float, cores: int, user_set: bool) -> int | None:
    """The thread count to switch to (1), or None to leave torch's choice alone."""
    if user_set or cores <= 1:
        return None
    return 1 if load > cores + overload_margin(cores) else None


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. a Slurm or cgroup cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def threads_set_by_user(cores: int) -> bool:
    """OMP_NUM_THREADS / MKL_NUM_THREADS, or a `torch.set_num_threads(n)` with n other than torch's default
    (one thread per usable core here); a call that sets the default value is indistinguishable from none."""
    return any(os.environ.get(name) for name in THREAD_VARIABLES) or torch.get_num_threads() != cores


def limit_threads_if_oversubscribed(device: torch.device) -> None:
    """On a CPU device, switch torch to one thread when the cores are oversubscribed (see the module)."""
    if device.type != "cpu":
        return
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        return
    cores = available_cores()
    threads = threads_for_load(load, cores, threads_set_by_user(cores))
    if threads is not None:
        logger.warning("the CPU is oversubscribed (1-minute load %.1f on %d cores): torch uses %d thread instead "
                       "of %d, as its threads slow down many times when they share cores; set OMP_NUM_THREADS "
                       "or torch_threads to choose", load, cores, threads, torch.get_num_threads())
        torch.set_num_threads(threads)


def choose_threads(device: torch.device, torch_threads: int | None) -> int:
    """Set torch's thread count for a run on `device` at its start: `torch_threads` when given, else torch's
    choice, lowered on an oversubscribed CPU (`limit_threads_if_oversubscribed`). Returns the count."""
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    else:
        limit_threads_if_oversubscribed(device)
    return torch.get_num_threads()


def threads_for_resume(saved: int | None, current: int, chosen: bool) -> int | None:
    """The thread count a resumed run switches to: the saved one, unless the user chose a count (then it
    stays, with a warning from `resume_threads`) or nothing differs. None: keep `current`."""
    if saved is None or saved == current or chosen:
        return None
    return saved


def resume_threads(device: torch.device, saved: int | None, chosen: bool) -> None:
    """On a CPU run resumed from a checkpoint that ran with `saved` threads: take that count again, or warn
    when the user chose another (the resumed losses then differ in the last bits from an uninterrupted run)."""
    if device.type != "cpu" or saved is None:
        return
    current = torch.get_num_threads()
    threads = threads_for_resume(saved, current, chosen or any(os.environ.get(name) for name in THREAD_VARIABLES))
    if threads is not None:
        logger.info("torch uses %d thread(s), as the resumed run did (CPU sums depend on the count)", threads)
        torch.set_num_threads(threads)
    elif saved != current:
        logger.warning("this run uses %d torch thread(s), the checkpoint's run used %d: CPU sums add in another "
                       "order, so losses will differ in their last bits from an uninterrupted run", current, saved)
