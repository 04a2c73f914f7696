"""A real two-node Ray cluster on 127.0.0.1 for tests: `ray start --head` plus one worker node.

Both nodes are `ray start ... --block` processes, each in a session of its own, so stopping the cluster
is a signal to those two process groups (what these tests started), never `ray stop`, which ends every
Ray process of the machine. Each node has one CPU: two tasks run at once, one per node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tessera.platform.clusters.local import free_port

READY_TIMEOUT = 90.0


def ray_binary() -> str:
    candidate = Path(sys.executable).parent / "ray"
    return str(candidate) if candidate.exists() else "ray"


def cluster_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the nodes and of drivers connecting to them (no usage stats, no token)."""
    env = {**os.environ, **(extra or {})}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    return env


@dataclass
class RayCluster:
    address: str
    temp_dir: str
    env: dict[str, str]
    nodes: list[subprocess.Popen] = field(default_factory=list)

    def worker_pids(self, task_name: str) -> list[int]:
        """Processes of this machine currently running a task of that name (Ray titles its workers
        `ray::NAME` while they execute one)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                if cmdline.startswith(f"ray::{task_name}"):
                    pids.append(int(proc.name))
        return pids

    def stop(self) -> None:
        """SIGKILL every process of the nodes' sessions (the `ray start` processes, their GCS, raylets,
        agents and workers: started by us, all in the sessions we created). A graceful `ray start`
        shutdown takes half a minute on a loaded machine and brings nothing to a throw-away cluster."""
        sessions = {node.pid for node in self.nodes}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    if int((proc / "stat").read_text().rpartition(")")[2].split()[3]) in sessions:
                        os.kill(int(proc.name), signal.SIGKILL)
        for node in self.nodes:
            node.wait(timeout=30)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _wait_for_port(port: int, nodes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if nodes[0].poll() is not None:
            raise RuntimeError(f"the Ray head exited with {nodes[0].returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the Ray head did not listen on port {port} in {READY_TIMEOUT:.0f}s")


def _wait_for_nodes(address: str, env: dict[str, str], count: int, nodes: list[subprocess.Popen]) -> None:
    """One driver polls the cluster until `count` nodes are alive (a driver costs seconds to start)."""
    probe = ("import ray, sys, time; ray.init(address=sys.argv[1], logging_level='ERROR')\n"
             "while sum(1 for n in ray.nodes() if n['Alive']) < int(sys.argv[2]): time.sleep(0.2)")
    waiter = subprocess.Popen([sys.executable, "-c", probe, address, str(count)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + READY_TIMEOUT
    try:
        while waiter.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray cluster at {address} did not reach {count} nodes in {READY_TIMEOUT:.0f}s")
            for node in nodes:
                if node.poll() is not None:
                    raise RuntimeError(f"a Ray node exited with {node.returncode}: {node.args}")
            time.sleep(0.2)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    if waiter.returncode != 0:
        raise RuntimeError(f"could not connect to the Ray cluster at {address}")


def start_cluster(extra_env: dict[str, str] | None = None) -> RayCluster:
    """Start the head and one worker node; returns once both are alive."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    temp_dir = tempfile.mkdtemp(prefix="tray-", dir="/tmp")  # short: Ray's socket paths live below it
    env = cluster_env(extra_env)
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats", "--block"]
    cluster = RayCluster(address, temp_dir, env)
    try:
        head = [ray_binary(), "start", "--head", "--port", str(port), "--include-dashboard=false",
                "--temp-dir", temp_dir, *common]
        cluster.nodes.append(subprocess.Popen(head, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
        _wait_for_port(port, cluster.nodes)
        worker = [ray_binary(), "start", "--address", address, *common]
        cluster.nodes.append(subprocess.Popen(worker, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
        _wait_for_nodes(address, env, 2, cluster.nodes)
    except BaseException:
        cluster.stop()
        raise
    return cluster
