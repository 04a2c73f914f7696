"""Two virtual Slurm clusters on one host (scripts/slurm-up.sh) own their daemons: tearing one down
(scripts/slurm-down.sh) leaves the other's munged, slurmctld, slurmd and running job alone.

Before, the second cluster reused the first one's munged (and lost it when the first stopped), and
slurm-down.sh killed every process in any slurm cgroup, so one test session's teardown killed another's
jobs. Both clusters here are private to this test (one node each), not the session's `slurm_cluster`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from platform_helpers import SlurmCluster, free_port_block, wait_for

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def pids_of(folder: Path) -> dict[str, int]:
    """The cluster's daemons by their pid files: slurmctld, each slurmd, and its munged."""
    files = {p.stem: p for p in (folder / "run").glob("*.pid")}
    conf = (folder / "etc" / "slurm.conf").read_text()
    socket = next(line.split("=", 2)[2] for line in conf.splitlines() if line.startswith("AuthInfo=socket="))
    files["munged"] = Path(socket).with_name("munged.pid")
    return {name: int(path.read_text()) for name, path in files.items()}


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def up(folder: Path) -> SlurmCluster:
    done = subprocess.run(["bash", str(SCRIPTS / "slurm-up.sh"), str(folder), "1", str(free_port_block(1))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return SlurmCluster(folder, folder / "etc" / "slurm.conf", (folder / "etc" / "nodes").read_text().split())


def down(folder: Path) -> None:
    subprocess.run(["bash", str(SCRIPTS / "slurm-down.sh"), str(folder)], capture_output=True, timeout=120)


@pytest.fixture
def two_clusters(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[tuple[SlurmCluster, SlurmCluster]]:
    """`slurm_cluster` only so that this test skips or fails exactly as the other Slurm tests do."""
    assert shutil.which("slurmctld")
    first = up(tmp_path / "first")
    try:
        second = up(tmp_path / "second")
    except BaseException:
        down(first.folder)
        raise
    yield first, second
    down(first.folder)
    down(second.folder)


def test_tearing_one_cluster_down_leaves_the_other_running(two_clusters: tuple[SlurmCluster, SlurmCluster]) -> None:
    first, second = two_clusters
    assert set(first.nodes).isdisjoint(second.nodes)       # the cgroups are named after the nodes
    theirs, ours = pids_of(first.folder), pids_of(second.folder)
    assert theirs["munged"] != ours["munged"]
    job = {c.folder: c.run("sbatch", "--parsable", "-N1", "--output=/dev/null", "--wrap", "sleep 300").strip() for c in (first, second)}

    def state(cluster: SlurmCluster) -> str:
        return cluster.run("squeue", "-h", "-j", job[cluster.folder], "-o", "%T %r", check=False).strip()

    wait_for(lambda: state(first).startswith("RUNNING") and state(second).startswith("RUNNING"), timeout=60,
             what=f"both jobs to run ({job}: {state(first)!r}, {state(second)!r})")
    down(first.folder)
    assert not any(running(pid) for pid in theirs.values())
    assert all(running(pid) for pid in ours.values())
    assert state(second).startswith("RUNNING")                     # its job was not killed with the other's
    assert second.run("srun", "-N1", "hostname")            # its munged, slurmctld and slurmd still answer
    second.run("scancel", job[second.folder])
