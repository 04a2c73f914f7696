"""Builders shared by the streaming tests, and the runner of real reader processes (reader_proc.py).

A sample carries its own identity: column "id" is a number unique across the datasets of a test, and
the payload columns are pure functions of it (`expected_x`, `expected_s`, `expected_blob`), so a reader
can prove it got the right bytes, not just the right count.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tessera.shards import ShardWriter
from tessera.storage.state_folder import is_state_folder

HERE = Path(__file__).resolve().parent
READER = HERE / "reader_proc.py"
PYTHON = sys.executable

def clear_world_env(monkeypatch) -> None:
    """A single-process world: no torchrun or Slurm variables leak in from the shell running pytest."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)


def three_stream_plans(shuffle: bool = True, seed: int = 3):
    """Plans of a three-stream mix: stream 0 whole (every sample once), stream 1 repeated 1.5x,
    stream 2 a choose-subset."""
    from tessera.stream.batching.epoch_plan import PlanConfig, RunPlan
    from tessera.stream.batching.mixing import StreamShards
    from tessera.stream.batching.stream_batches import StreamPlans

    streams = [StreamShards([30, 25, 40, 10]), StreamShards([20, 20, 15], repeat=1.5),
               StreamShards([50, 7], choose=44)]
    return StreamPlans(RunPlan(streams, PlanConfig(seed=seed, num_lanes=4, shuffle=shuffle, shuffle_block_size=16)))


ELASTIC_COLUMNS = {"id": "int", "x": "ndarray:int64:4", "s": "str"}
BLOB_COLUMNS = {"id": "int", "blob": "ndarray:uint8"}


def expected_x(i: int) -> np.ndarray:
    return np.array([i, 3 * i, -i, 7], dtype=np.int64)


def expected_s(i: int) -> str:
    return f"s{i}:" + "ab" * (i % 9)  # variable size, so shards hold different sample counts


def expected_blob(i: int, size: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.int64) * 31 + i) % 251).astype(np.uint8)


def write_elastic(out: str | Path, ids: Iterable[int], size_limit: int = 1400, **kwargs: Any) -> None:
    """Small samples with a fixed and a variable column; ~25-35 samples per shard by default."""
    with ShardWriter(out, ELASTIC_COLUMNS, size_limit=size_limit, **kwargs) as writer:
        for i in ids:
            writer.write({"id": i, "x": expected_x(i), "s": expected_s(i)})


# Two streams for the batching-method tests: A holds ids 0..N_A-1, B holds ids B_BASE..B_BASE+N_B-1 in
# smaller shards; a global sample index i is id i in A, or id i - N_A + B_BASE in B.
N_A, B_BASE, N_B = 240, 10_000, 90


def write_two_streams(root: Path) -> Path:
    write_elastic(root / "A", range(N_A))
    write_elastic(root / "B", range(B_BASE, B_BASE + N_B), size_limit=1100)
    return root


def two_stream_ids(index: np.ndarray) -> list[int]:
    """The ids of global sample indices of the two streams (A first, then B), in order."""
    return np.where(index < N_A, index, index - N_A + B_BASE).tolist()


def write_blobs(out: str | Path, ids: Iterable[int], blob_size: int, size_limit: int | str,
                **kwargs: Any) -> None:
    """Big samples (for download, crash and cache-limit tests)."""
    with ShardWriter(out, BLOB_COLUMNS, size_limit=size_limit, **kwargs) as writer:
        for i in ids:
            writer.write({"id": i, "blob": expected_blob(i, blob_size)})


# --- real reader processes ---------------------------------------------------------------------------

def rank_env(rank: int, world_size: int, local_world_size: int, **extra: str) -> dict[str, str]:
    """The environment torchrun would give `rank`, on top of ours (S3 settings included)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "SLURM_"))}
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(local_world_size),
               LOCAL_RANK=str(rank % local_world_size), OMP_NUM_THREADS="1", **extra)
    # reader_proc.py imports fork_server from tests/ (its own folder is on its path as a script's is)
    path = [str(HERE.parents[1] / "src"), str(HERE.parent), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env


class Proc:
    """One reader process running a list of jobs (see reader_proc.py); results land in a JSON file.

    Started either as a fresh interpreter (`server=None`) or forked by a `ReaderServer`; both are
    separate OS processes with their own rank environment, in a process group of their own.
    """

    def __init__(self, workdir: Path, name: str, jobs: Sequence[dict], env: dict[str, str],
                 server: ReaderServer | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.jobs_path = workdir / f"{name}.jobs.json"
        self.out_path = workdir / f"{name}.out.json"
        self.log_path = workdir / f"{name}.log"
        self.rc_path = workdir / f"{name}.out.json.rc"
        self.jobs_path.write_text(json.dumps(list(jobs)))
        for path in (self.out_path, self.rc_path):
            path.unlink(missing_ok=True)
        self.popen: subprocess.Popen | None = None
        if server is None:
            with open(self.log_path, "wb") as log:
                self.popen = subprocess.Popen([PYTHON, str(READER), str(self.jobs_path), str(self.out_path)],
                                              env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True)
            self.pid = self.popen.pid
        else:
            self.pid = server.spawn({"jobs": str(self.jobs_path), "out": str(self.out_path),
                                     "log": str(self.log_path), "env": env})

    def poll(self) -> int | None:
        """Exit code (negative: killed by that signal), or None while running."""
        if self.popen is not None:
            return self.popen.poll()
        try:
            return int(self.rc_path.read_text())
        except FileNotFoundError:
            return None

    def wait(self, timeout: float = 120.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"{self.name} did not finish in {timeout:.0f} s (blocked?); "
                                     f"log:\n{self.log()}")
            time.sleep(0.02)
        if code != 0:
            raise AssertionError(f"{self.name} exited with {code}; log:\n{self.log()}")
        return json.loads(self.out_path.read_text())

    def group(self) -> dict[int, int]:
        """{pid: parent pid} of every process in the process group: the reader, its DataLoader workers
        and multiprocessing's helpers (forkserver, resource tracker)."""
        out = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[2]) == self.pid:  # fields 4 and 5: parent, process group
                    out[int(entry)] = int(fields[1])
        return out

    def group_pids(self) -> list[int]:
        return list(self.group())

    def open_files(self) -> list[str]:
        """Files the process group has open right now."""
        out = []
        for pid in self.group_pids():
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    pass
        return out

    def shm_names(self) -> set[str]:
        """Names in /dev/shm the process group has open or mapped right now (deleted ones included)."""
        out = set()
        for pid in self.group():
            paths = []
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                    except OSError:
                        pass
                paths += [line.split(maxsplit=5)[5] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                          if "/dev/shm/" in line]
            except (OSError, IndexError):
                continue
            out |= {p.split("/dev/shm/", 1)[1].removesuffix(" (deleted)")
                    for p in paths if p.startswith("/dev/shm/")}
        return out

    def kill_readers(self) -> list[int]:
        """SIGKILL the reader process and its DataLoader workers (a crash), not multiprocessing's
        helper processes: those outlive the crash and clean up after it, as they would in a job."""
        group = self.group()
        helpers = set()
        for pid, parent in group.items():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"multiprocessing.resource_tracker" in cmd or (b"multiprocessing.forkserver" in cmd
                                                              and parent == self.pid):
                helpers.add(pid)
        victims = [pid for pid in group if pid not in helpers]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return victims

    def wait_gone(self, timeout: float = 30.0) -> None:
        """Until every process of the group (helpers included) has exited."""
        deadline = time.monotonic() + timeout
        while self.poll() is None or self.group():
            assert time.monotonic() < deadline, f"{self.name}: processes left: {self.group()}"
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the process and its DataLoader workers (its own process group, nothing else)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except FileNotFoundError:
            return "(no log)"


class ReaderServer:
    """`reader_proc.py --serve`: forks reader processes without paying the interpreter start-up each time."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self._log = open(workdir / "server.log", "wb")  # noqa: SIM115 (closed in close)
        self.popen = subprocess.Popen([PYTHON, str(READER), "--serve"], env=env or rank_env(0, 1, 1),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                      start_new_session=True)
        self.children: list[int] = []

    def spawn(self, cmd: dict) -> int:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write((json.dumps(cmd) + "\n").encode())
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"reader server died: {(Path(self._log.name)).read_text(errors='replace')}")
        self.children.append(int(line))
        return int(line)

    def close(self) -> None:
        """Stop serving; readers still running after 60 s are killed (each is its own process group)."""
        if self.popen.stdin:
            self.popen.stdin.close()
        try:
            self.popen.wait(60)
        except subprocess.TimeoutExpired:
            for pgid in [*self.children, self.popen.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            self.popen.wait()
        self._log.close()


def run_layout(workdir: Path, name: str, world_size: int, local_world_size: int, jobs: Sequence[dict],
               server: ReaderServer | None = None, **extra_env: str) -> list[Proc]:
    """Start one process per rank of a layout (all running `jobs`); returns them unwaited."""
    return [Proc(workdir, f"{name}-r{rank}", jobs, rank_env(rank, world_size, local_world_size, **extra_env),
                 server) for rank in range(world_size)]


def wait_all(procs: Sequence[Proc], timeout: float = 150.0) -> list[list[dict]]:
    """Results of each process (in order), each a list of job results."""
    deadline = time.monotonic() + timeout
    return [p.wait(max(1.0, deadline - time.monotonic())) for p in procs]


# --- reading results ---------------------------------------------------------------------------------

def global_batches(rank_batches: Sequence[Sequence[Sequence[int]]]) -> list[Counter]:
    """Global batch t as a multiset: the union over ranks of each rank's batch t."""
    counts = {len(b) for b in rank_batches}
    assert len(counts) == 1, f"ranks served different numbers of batches: {[len(b) for b in rank_batches]}"
    return [sum((Counter(rb[t]) for rb in rank_batches), Counter()) for t in range(counts.pop())]


def flatten(batches: Iterable[Iterable[int]]) -> list[int]:
    return [i for b in batches for i in b]


def cache_data_bytes(root: Path) -> int:
    """Bytes of shard data in a cache folder: shard files and in-flight temp files, not metadata."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not is_state_folder(d)]
        for name in filenames:
            if name == "index.json":
                continue
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def shard_files(root: Path) -> list[str]:
    """Shard files (complete or in flight) in a cache folder."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not is_state_folder(d)]
        out += [os.path.join(dirpath, n) for n in filenames if n != "index.json"]
    return out
