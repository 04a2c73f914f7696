"""Fixtures for the platform: a private TESSERA_HOME with a fast supervisor, and a real single-host
Slurm cluster (scripts/slurm-up.sh) shared by the whole session."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from platform_helpers import SlurmCluster, free_port_block
from trainer_helpers import STEPS, TIMEOUT, final_weights, losses, train_command, write_corpus

from tessera.platform import Platform
from tessera.platform.clusters.local import _processes_running
from tessera.platform.supervision.supervisor import stop_supervisor

ROOT = Path(__file__).resolve().parents[2]


def _kill_leftovers(platform: Platform) -> None:
    """SIGKILL the process group of every local resumption still alive (a failed test must not leak)."""
    for run in platform.db.list_runs():
        for res in platform.db.resumptions(run.id):
            if res.cluster != "local":
                continue
            known = (res.handle or {}).get("pid")
            # a resumption whose submission was interrupted has no handle: find its launcher by folder
            pids = [int(known)] if known else _processes_running(str(Path(res.folder) / "launch.py"))
            for pid in pids:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


@pytest.fixture
def platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A Platform on a fresh TESSERA_HOME; its supervisor polls every 0.2 s and retries without delay."""
    home = tmp_path / "home"
    monkeypatch.setenv("TESSERA_HOME", str(home))
    monkeypatch.delenv("TESSERA_API_URL", raising=False)  # the CLI would talk to a server instead
    monkeypatch.delenv("TESSERA_API_KEY", raising=False)
    monkeypatch.setenv("TESSERA_SUPERVISOR_POLL", "0.2")
    monkeypatch.setenv("TESSERA_SUPERVISOR_IDLE", "60")
    monkeypatch.setenv("TESSERA_RETRY_BACKOFF", "0")
    p = Platform(home)
    yield p
    stop_supervisor(home)
    _kill_leftovers(p)
    p.close()


# --- Slurm ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> SlurmCluster:
    """Three virtual nodes (NAME-n1..NAME-n3, etc/nodes) on this host. Skipped (loudly) only when Slurm cannot be installed
    here and this is not CI; in CI (CI=true) that is a failure."""
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")

    def unavailable(reason: str) -> None:
        if in_ci:
            pytest.fail(f"Slurm is required in CI: {reason}")
        pytest.skip(f"SLURM TESTS SKIPPED: {reason}")

    if os.geteuid() != 0:
        unavailable("scripts/slurm-up.sh needs root to install and start Slurm")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        unavailable("slurmctld is not installed and apt-get is unavailable to install it")
    folder = tmp_path_factory.mktemp("slurm")
    nodes = 3
    started = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-up.sh"), str(folder), str(nodes),
                           str(free_port_block(nodes))], capture_output=True, text=True, timeout=300)
    if done.returncode == 3:
        unavailable(done.stderr.strip())
    if done.returncode != 0:
        subprocess.run(["bash", str(ROOT / "scripts" / "slurm-down.sh"), str(folder)], capture_output=True)
        pytest.fail(f"slurm-up.sh failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(f"\nslurm-up.sh: {time.monotonic() - started:.1f} s", file=sys.stderr)
    cluster = SlurmCluster(folder, folder / "etc" / "slurm.conf", (folder / "etc" / "nodes").read_text().split())
    yield cluster
    subprocess.run(["bash", str(ROOT / "scripts" / "slurm-down.sh"), str(folder)], capture_output=True)


# --- the real trainer -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Byte-tokenized 32-token windows (train + val), prepared once."""
    pytest.importorskip("torch")
    from tessera.llm.prep import prep

    root = tmp_path_factory.mktemp("tinydata")
    write_corpus(root / "corpus")
    prep(root / "corpus", root / "data", "byte", seq_len=32, val_fraction=0.2)
    return root / "data"


@pytest.fixture(scope="session")
def reference(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """Losses and final weights of the uninterrupted run, outside the platform: one run shared by every
    test that checks a resumed run ends bitwise the same (test_real_trainer.py, test_faults.py)."""
    folder = tmp_path_factory.mktemp("reference")
    done = subprocess.run(["bash", "-c", train_command(tiny_data, folder)], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    loss = losses(folder)
    assert sorted(loss) == list(range(1, STEPS + 1)) and loss[STEPS] < loss[1] - 0.5
    return loss, final_weights(folder)
