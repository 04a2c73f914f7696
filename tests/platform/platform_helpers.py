"""Helpers for the platform tests (a module of its own: several test folders have a conftest.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tessera.platform import Platform

FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")
# sitecustomize.py there injects faults into the processes that have this folder on their PYTHONPATH
FAULT_PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def free_port_block(count: int) -> int:
    """A port P with P..P+count free on 127.0.0.1 (slurmctld on P, slurmd i on P+i)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 60000:
            continue
        try:
            for port in range(base, base + count + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free block of ports for Slurm")


def trainer_command(state: Path, *extra: str) -> str:
    return f"{sys.executable} {FAKE_TRAINER} --state {state} " + " ".join(extra)


def steps_done(state: Path) -> list[int]:
    path = state / "steps.log"
    return [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(predicate, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class SlurmCluster:
    folder: Path
    conf: Path
    nodes: list[str]

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> str:
        return subprocess.run(args, check=check, capture_output=True, text=True, env=self.env()).stdout

    def add_to(self, platform: Platform, name: str = "slurm") -> None:
        platform.add_cluster(name, "slurm", slurm_conf=str(self.conf))

    @contextmanager
    def node_down(self, node: str) -> Iterator[None]:
        """Take `node` down as a failing machine would be (Slurm kills its jobs: NODE_FAIL), and bring it
        back afterwards so later tests find a healthy cluster."""
        self.run("scontrol", "update", f"nodename={node}", "state=down", "reason=tessera-fault-test")
        try:
            yield
        finally:
            self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
