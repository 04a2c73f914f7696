"""torch's CPU thread count: decided once, at a run's first start, from the CPUs this process may use.

torch's intra-op pool starts one thread per core of its affinity mask and its threads wait for each other
at every operator. Three things make that count wrong, and each slows a CPU step down many times:
- a cgroup CPU quota (a container's `--cpus`, a Kubernetes limit): torch does not read it, so 8 threads
  share a quota of 2 CPUs and are throttled mid-operator;
- several ranks of one job on the node (torchrun's LOCAL_WORLD_SIZE): each would start one per core;
- other processes already keeping the cores busy: each operator then waits for the slowest thread to be
  scheduled again (benchmarks/cpu_threads.py: a step 8-40x slower than with one thread).
So the count is the CPUs this process may use (`usable_cpus`: the affinity mask, capped by the cgroup
quota, shared by the local ranks), less those other processes keep busy at the start (`busy_cpus`: the
allowed CPUs' busy time over a short sample of /proc/stat), at least one. OMP_NUM_THREADS, MKL_NUM_THREADS,
an earlier `torch.set_num_threads` or the run's `torch_threads` win over all of this.

The count is part of a run's arithmetic: CPU reductions (a layer norm's sums, say) split their work by
thread and add the parts in another order with another count. So the count is decided at a run's first
start, saved in its checkpoints, and a resumed run takes it again (`threads_for_resume`), whatever the
machine is doing then: that is what keeps a resumed CPU run bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
CGROUP_ROOT = Path("/sys/fs/cgroup")
SAMPLE_SECONDS = 0.1    # how long the CPUs' busy time is sampled at the start (10 ticks of each CPU)
SAMPLE_REUSED = 60.0    # seconds a sample serves the next runs of the process (a notebook, a test session)
IDLE_SLACK = 0.3        # a CPU counts as free from 70% idle on (the sampled process's own noise)
_samples: dict[str, tuple[float, float | None]] = {}   # "busy": (when, busy CPUs)


# --- the CPUs this process may use -----------------------------------------------------------------

def quota_cpus(cpu_max: str | None = None, cfs_quota: str | None = None, cfs_period: str | None = None) -> float | None:
    """CPUs a cgroup's quota allows, from cgroup v2's `cpu.max` ("150000 100000": 1.5; "max 100000": none)
    or v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us` (-1: none). None: no quota."""
    if cpu_max is not None:
        quota, _, period = cpu_max.strip().partition(" ")
    else:
        quota, period = (cfs_quota or "-1").strip(), (cfs_period or "100000").strip()
    if quota in ("max", "-1", "") or not period:
        return None
    return int(quota) / int(period)


def cgroup_cpu_limit(proc_cgroup: str, root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs the cgroup quotas allow this process: the smallest quota on its cgroup's path (from
    /proc/self/cgroup's text) and its ancestors' under `root`, v2 or v1. None: no quota anywhere. In a
    container whose cgroup path is not mounted under its own name, the mount's root is the container's."""
    limits = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":            # v2: one hierarchy at the root
            mount, files = root, ("cpu.max",)
        elif "cpu" in controllers.split(","):
            mount = next((root / name for name in (controllers, "cpu", "cpu,cpuacct") if (root / name).is_dir()), None)
            files = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
            if mount is None:
                continue
        else:
            continue
        folder = mount / path.strip("/")
        for level in [folder, *folder.parents]:
            if level.is_relative_to(mount) and (level / files[0]).is_file():
                texts = [(level / name).read_text() for name in files]
                limits.append(quota_cpus(*texts) if len(files) == 1 else quota_cpus(None, *texts))
            if level == mount:
                break
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def affinity_cores() -> int:
    """Cores this process may run on (its affinity mask, e.g. a Slurm or cgroup cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def local_ranks() -> int:
    """Processes of this job on this machine (torchrun's LOCAL_WORLD_SIZE; 1 when unset)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def usable_cpus(affinity: int, quota: float | None, ranks: int = 1) -> int:
    """CPUs one rank may keep busy: the affinity mask's cores, capped by the quota (rounded down: 1.5 CPUs
    of quota run one thread unthrottled, two throttled), shared by the node's `ranks`; at least 1."""
    cpus = affinity if quota is None else min(affinity, math.floor(quota))
    return max(1, cpus // max(1, ranks))


def available_cores() -> int:
    """`usable_cpus` of this process (affinity, cgroup quota; not divided among ranks)."""
    try:
        quota = cgroup_cpu_limit(Path("/proc/self/cgroup").read_text())
    except (OSError, ValueError):  # no /proc, or a cgroup file we cannot read
        quota = None
    return usable_cpus(affinity_cores(), quota)


# --- what other processes keep busy ----------------------------------------------------------------

def cpu_ticks(stat: str, cpus: set[int]) -> tuple[int, int]:
    """(idle, total) clock ticks of `cpus` from /proc/stat's text; idle counts iowait too."""
    idle = total = 0
    for line in stat.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(f) for f in fields[:8]]   # user nice system idle iowait irq softirq steal
            idle, total = idle + ticks[3] + ticks[4], total + sum(ticks)
    return idle, total


def busy_cpus(before: tuple[int, int], after: tuple[int, int], cpus: int) -> float:
    """How many of `cpus` were busy between two `cpu_ticks` samples (0.0 when no tick passed)."""
    ticks = after[1] - before[1]
    return 0.0 if ticks <= 0 else cpus * (1 - (after[0] - before[0]) / ticks)


def sample_busy_cpus(seconds: float = SAMPLE_SECONDS) -> float | None:
    """CPUs of this process's affinity mask other processes keep busy now (this one sleeps meanwhile); a
    sample of the last minute is reused. None: no /proc/stat."""
    when, busy = _samples.get("busy", (-math.inf, None))
    if time.monotonic() - when > SAMPLE_REUSED:
        busy = _sample(seconds)
        _samples["busy"] = (time.monotonic(), busy)
    return busy


def _sample(seconds: float) -> float | None:
    try:
        cpus = os.sched_getaffinity(0)
        before = cpu_ticks(Path("/proc/stat").read_text(), cpus)
        time.sleep(seconds)
        after = cpu_ticks(Path("/proc/stat").read_text(), cpus)
    except (AttributeError, OSError, ValueError):  # not Linux
        return None
    return busy_cpus(before, after, len(cpus))


def default_threads(usable: int, busy: float | None, affinity: int) -> int:
    """The thread count of a run nobody chose one for: the usable CPUs less what others keep busy."""
    if busy is None:
        return usable
    free = math.floor(affinity - busy + IDLE_SLACK)
    return max(1, min(usable, free))


# --- the run's choice ------------------------------------------------------------------------------

def threads_set_by_user(affinity: int) -> bool:
    """OMP_NUM_THREADS / MKL_NUM_THREADS, or a `torch.set_num_threads(n)` with n other than torch's default
    (one thread per core of the affinity mask); a call that sets the default value is indistinguishable."""
    return any(os.environ.get(name) for name in THREAD_VARIABLES) or torch.get_num_threads() != affinity


def choose_threads(device: torch.device, torch_threads: int | None) -> int:
    """Set torch's thread count for a run on `device` at its first start (module docstring): `torch_threads`
    when given, the user's when set otherwise, else `default_threads`. Returns the count."""
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
        return torch_threads
    affinity = affinity_cores()
    if device.type != "cpu" or threads_set_by_user(affinity):
        return torch.get_num_threads()
    available = available_cores()
    usable = usable_cpus(available, None, local_ranks())
    busy = sample_busy_cpus() if usable > 1 else None  # one thread either way: no 0.1 s sample
    threads = default_threads(usable, busy, affinity)
    if threads < usable:
        logger.warning("%.1f of the %d CPUs this process may use are busy with other processes: torch uses %d "
                       "thread(s) instead of %d, as its threads slow down many times when they share cores; set "
                       "OMP_NUM_THREADS or torch_threads to choose", busy, affinity, threads, usable)
    elif threads != affinity:
        logger.info("torch uses %d thread(s): %d core(s) in this process's affinity mask, %d within its cgroup's "
                    "CPU quota, shared by %d local rank(s)", threads, affinity, available, local_ranks())
    torch.set_num_threads(threads)
    return threads


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
