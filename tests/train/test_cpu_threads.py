"""torch's CPU thread count (train/cpu_threads.py): the CPUs a process may use from its affinity mask and a
cgroup quota (fake cgroup trees, v2 and v1), what other processes keep busy from /proc/stat's ticks, the
choice made from both (pure functions), and its wiring with the busy sample injected; a resumed run
takes its saved count again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tessera.train import cpu_threads
from tessera.train.cpu_threads import (
    busy_cpus,
    cgroup_cpu_limit,
    cpu_ticks,
    default_threads,
    quota_cpus,
    usable_cpus,
)


def test_quota_files_of_cgroup_v2_and_v1() -> None:
    assert quota_cpus("150000 100000\n") == 1.5
    assert quota_cpus("max 100000\n") is None
    assert quota_cpus(None, "200000\n", "100000\n") == 2.0
    assert quota_cpus(None, "-1\n", "100000\n") is None


def _write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text)


def test_the_smallest_quota_on_the_cgroup_path_counts(tmp_path: Path) -> None:
    _write(tmp_path, cpu__max="max 100000\n")                                   # v2: the root has none
    _write(tmp_path / "kubepods" / "pod1", cpu__max="400000 100000\n")         # the pod: 4 CPUs
    _write(tmp_path / "kubepods" / "pod1" / "ctr", cpu__max="250000 100000\n")  # the container: 2.5
    assert cgroup_cpu_limit("0::/kubepods/pod1/ctr\n", tmp_path) == 2.5
    assert cgroup_cpu_limit("0::/kubepods/pod1\n", tmp_path) == 4.0
    assert cgroup_cpu_limit("0::/\n", tmp_path) is None
    assert cgroup_cpu_limit("0::/docker/abc\n", tmp_path) is None   # a path not mounted here: the root's
    v1 = tmp_path / "v1"
    _write(v1 / "cpu,cpuacct", cpu__cfs_quota_us="-1\n", cpu__cfs_period_us="100000\n")
    _write(v1 / "cpu,cpuacct" / "slurm" / "job7", cpu__cfs_quota_us="300000\n", cpu__cfs_period_us="100000\n")
    assert cgroup_cpu_limit("4:memory:/slurm/job7\n3:cpu,cpuacct:/slurm/job7\n", v1) == 3.0
    assert cgroup_cpu_limit("3:cpu,cpuacct:/\n", v1) is None


@pytest.mark.parametrize(("affinity", "quota", "ranks", "expected"), [
    (8, None, 1, 8),      # the affinity mask alone
    (8, 2.5, 1, 2),       # a quota of 2.5 CPUs: 2 threads run unthrottled
    (2, 16.0, 1, 2),      # a quota above the mask
    (8, 0.5, 1, 1),       # at least one
    (8, None, 4, 2),      # four local ranks share the cores
    (2, None, 4, 1),
])
def test_usable_cpus(affinity: int, quota: float | None, ranks: int, expected: int) -> None:
    assert usable_cpus(affinity, quota, ranks) == expected


STAT = """cpu  1000 0 0 1000 0 0 0 0 0 0
cpu0 {u0} 0 0 {i0} 0 0 0 0 0 0
cpu1 {u1} 0 0 {i1} 0 0 0 0 0 0
cpu2 {u2} 0 0 {i2} 0 0 0 0 0 0
intr 1 2 3
"""


def test_busy_cpus_of_the_affinity_mask_from_proc_stat() -> None:
    before = STAT.format(u0=100, i0=100, u1=100, i1=100, u2=100, i2=100)
    after = STAT.format(u0=125, i0=100, u1=110, i1=115, u2=100, i2=125)   # cpu0 busy, cpu1 40%, cpu2 idle
    assert cpu_ticks(before, {0, 1}) == (200, 400)
    assert busy_cpus(cpu_ticks(before, {0, 1}), cpu_ticks(after, {0, 1}), 2) == pytest.approx(1.4)
    assert busy_cpus(cpu_ticks(before, {2}), cpu_ticks(after, {2}), 1) == 0.0
    assert busy_cpus(cpu_ticks(before, {0}), cpu_ticks(before, {0}), 1) == 0.0   # no tick passed


@pytest.mark.parametrize(("usable", "busy", "affinity", "expected"), [
    (2, 0.1, 2, 2),     # idle
    (2, 2.0, 2, 1),     # two busy processes on two cores: one thread
    (2, 1.0, 2, 1),     # one: the other core alone
    (8, 2.0, 8, 6),     # two busy of eight
    (2, 0.0, 8, 2),     # a quota of 2 on an idle 8-core mask
    (2, 7.5, 8, 1),
    (4, None, 4, 4),    # no /proc/stat: the usable CPUs
])
def test_default_threads(usable: int, busy: float | None, affinity: int, expected: int) -> None:
    assert default_threads(usable, busy, affinity) == expected


@given(usable=st.integers(1, 512), busy=st.floats(0, 1024), extra=st.integers(0, 512))
def test_the_default_is_between_one_and_the_usable_cpus(usable: int, busy: float, extra: int) -> None:
    assert 1 <= default_threads(usable, busy, usable + extra) <= usable


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def busy_two_cores(monkeypatch: pytest.MonkeyPatch, restore_threads) -> None:
    """Two usable cores both kept busy by others, no thread variables set, torch at its default of 2."""
    for name in cpu_threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(cpu_threads, "affinity_cores", lambda: 2)
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 2)
    monkeypatch.setattr(cpu_threads, "sample_busy_cpus", lambda: 2.0)
    torch.set_num_threads(2)


def test_busy_cores_give_one_thread_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch, busy_two_cores,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tessera.train.cpu_threads"):
        assert cpu_threads.choose_threads(torch.device("cpu"), None) == 1
    assert torch.get_num_threads() == 1
    (record,) = caplog.records
    assert record.getMessage().startswith("2.0 of the 2 CPUs this process may use are busy")

    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # chosen by the user: kept
    assert cpu_threads.choose_threads(torch.device("cpu"), None) == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu_threads.choose_threads(torch.device("meta"), None) == 2  # not a CPU run: untouched
    sampled = []
    monkeypatch.setattr(cpu_threads, "sample_busy_cpus", lambda: sampled.append(1) or 0.0)
    assert cpu_threads.choose_threads(torch.device("cpu"), None) == 2 and sampled == [1]  # idle: both cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")                          # two ranks share them: one each,
    assert cpu_threads.choose_threads(torch.device("cpu"), None) == 1 and sampled == [1]  # with no sample


@pytest.mark.parametrize(("saved", "current", "chosen", "expected"), [
    (2, 1, False, 2),      # started with 2 threads, resumed on a busy machine: 2 again
    (1, 2, False, 1),      # started busy with 1: 1 again
    (2, 2, False, None),   # nothing differs
    (None, 2, False, None),  # a checkpoint from before the count was saved
    (2, 1, True, None),    # the user chose 1 for this part: kept (with a warning)
])
def test_threads_for_resume(saved: int | None, current: int, chosen: bool, expected: int | None) -> None:
    assert cpu_threads.threads_for_resume(saved, current, chosen) == expected


def test_a_resumed_cpu_run_takes_the_saved_count_whatever_the_load(busy_two_cores,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    assert cpu_threads.choose_threads(torch.device("cpu"), None) == 1  # busy at this start
    cpu_threads.resume_threads(torch.device("cpu"), 2, chosen=False)  # the run began with 2
    assert torch.get_num_threads() == 2
    assert cpu_threads.choose_threads(torch.device("cpu"), 1) == 1  # torch_threads=1 given: the user's
    with caplog.at_level(logging.WARNING, logger="tessera.train.cpu_threads"):
        cpu_threads.resume_threads(torch.device("cpu"), 2, chosen=True)
    assert torch.get_num_threads() == 1
    assert "last bits" in caplog.records[-1].getMessage()
