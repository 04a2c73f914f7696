"""Fault injection into the real trainer (`tessera train`, trainer_helpers.py): a hang, an out-of-memory
error, a damaged newest checkpoint and a Slurm node taken down mid-run. Each run must end COMPLETED
with the expected resumptions, resumed from a checkpoint (not from the start), and with the same losses
and bitwise the same final weights as the uninterrupted `reference` run (conftest.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from platform_helpers import FAULT_PLUGINS, SlurmCluster, wait_for
from trainer_helpers import STEPS, TIMEOUT, assert_same_run, first_checkpoint, spec, train_command

from tessera.platform import Platform

pytest.importorskip("torch")


def resumed_at(folder: str) -> int:
    """The step a resumption's trainer started from (its fit_start event)."""
    events = (Path(folder) / "heartbeat.json.events.jsonl").read_text().splitlines()
    return next(e["step"] for e in map(json.loads, events) if e["kind"] == "fit_start")


def trainer_pid(platform: Platform, name: str) -> int:
    """The training process of the run's first resumption (the pid its heartbeat reports)."""
    beat = wait_for(lambda: platform.get_run(name).resumptions[0].last_heartbeat, timeout=TIMEOUT,
                    what="a heartbeat")
    return int(beat["pid"])


def step_of(checkpoint: str) -> int:
    return int(checkpoint.rsplit("-ba", 1)[1])


def test_a_hang_is_killed_after_hang_timeout_and_resumed(platform: Platform, tiny_data: Path, reference,
                                                         tmp_path: Path) -> None:
    """SIGSTOP freezes the trainer (no heartbeat, SIGTERM stays pending): after hang_timeout the supervisor
    sends SIGTERM, then SIGKILL after stop_grace, and retries from the newest checkpoint. hang_timeout
    must cover the trainer's start-up (the first heartbeat): 15 s. On a machine so busy that a restart
    takes longer, that restart is a hang too and is retried: the run still ends the same."""
    platform.create_run(spec("frozen", train_command(tiny_data, tmp_path), hang_timeout="15s", stop_grace="2s",
                             max_retries=4))
    first_checkpoint(tmp_path)
    os.kill(trainer_pid(platform, "frozen"), signal.SIGSTOP)
    run = platform.wait_for_run_status("frozen", "COMPLETED", timeout=TIMEOUT + 90)
    first, *retries = run.resumptions
    assert first.outcome == "hang" and first.exit_code == 137      # SIGTERM cannot reach a stopped process
    assert [r.outcome for r in retries][-1] == "completed" and {r.outcome for r in retries[:-1]} <= {"hang"}
    assert all(r.cause.startswith("retry after hang") for r in retries) and run.retries_used == len(retries)
    assert any(e.kind == "hang" and "hang_timeout 15s" in e.message for e in run.events)
    assert 0 < resumed_at(retries[-1].folder) < STEPS
    assert_same_run(tmp_path, reference)


def test_an_out_of_memory_error_is_classified_and_retried(platform: Platform, tiny_data: Path, reference,
                                                          tmp_path: Path) -> None:
    """TESSERA_FAULT_AT_STEP (tests/plugins/sitecustomize.py) raises CUDA's out-of-memory error after batch
    25 of the first attempt only; the platform reads the signature in the log: oom, retried (counted)."""
    command = f'if [ "$TESSERA_RESUMPTION" = 0 ]; then export TESSERA_FAULT_AT_STEP=25 PYTHONPATH={FAULT_PLUGINS}; fi; '
    platform.create_run(spec("oom", command + train_command(tiny_data, tmp_path)))
    run = platform.wait_for_run_status("oom", "COMPLETED", timeout=TIMEOUT)
    first, second = run.resumptions
    assert (first.outcome, first.exit_code) == ("oom", 1) and "out of memory" in first.detail
    assert "CUDA out of memory" in (Path(first.folder) / "node-0.log").read_text()
    assert second.cause.startswith("retry after oom") and run.retries_used == 1
    assert resumed_at(second.folder) == 20        # the checkpoint before the fault, not the start
    assert_same_run(tmp_path, reference)


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(platform: Platform, tiny_data: Path,
                                                                    reference, tmp_path: Path) -> None:
    """Freeze the trainer once it has three checkpoints, flip bytes in the newest one's model.pt (and in
    any newer one that reached its manifest meanwhile), kill it: the resumption detects the bad hash,
    warns, resumes from the one before, re-saves the damaged step and ends bitwise equal."""
    platform.create_run(spec("damaged", train_command(tiny_data, tmp_path)))
    pointer = tmp_path / "ckpt" / "latest"
    wait_for(lambda: pointer.exists() and step_of(pointer.read_text().strip()) >= 30, timeout=TIMEOUT,
             what="a third checkpoint")
    pid = trainer_pid(platform, "damaged")
    os.kill(pid, signal.SIGSTOP)
    newest = pointer.read_text().strip()
    damaged = [newest] + [p.name for p in (tmp_path / "ckpt").glob("ep*-ba*")
                          if step_of(p.name) > step_of(newest) and (p / "manifest.json").exists()]
    for name in damaged:
        with open(tmp_path / "ckpt" / name / "model.pt", "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(size // 2)
            middle = f.read(16)
            f.seek(size // 2)
            f.write(bytes(b ^ 0xFF for b in middle))
    os.kill(pid, signal.SIGKILL)
    run = platform.wait_for_run_status("damaged", "COMPLETED", timeout=TIMEOUT)
    first, second = run.resumptions
    assert (first.outcome, second.outcome) == ("crash", "completed")
    log = (Path(second.folder) / "node-0.log").read_text()
    assert f"{newest} is unusable" in log, log[-2000:]
    assert 0 < resumed_at(second.folder) < step_of(newest)
    assert_same_run(tmp_path, reference)


def test_a_slurm_node_taken_down_mid_run_is_excluded_and_the_run_resumes(
        platform: Platform, slurm_cluster: SlurmCluster, tiny_data: Path, reference, tmp_path: Path) -> None:
    slurm_cluster.add_to(platform)
    platform.create_run(spec("nodedown", train_command(tiny_data, tmp_path), cluster="slurm"))
    first_checkpoint(tmp_path)
    [victim] = wait_for(lambda: platform.get_run("nodedown").resumptions[0].nodes, timeout=TIMEOUT,
                        what="the job's node")
    with slurm_cluster.node_down(victim):
        run = platform.wait_for_run_status("nodedown", "COMPLETED", timeout=TIMEOUT)
    first, second = run.resumptions
    assert (first.outcome, first.status) == ("node_fault", "NODE_FAIL") and victim in first.detail
    assert second.cause.startswith("retry after node_fault") and second.nodes and victim not in second.nodes
    assert platform.db.excluded_nodes("slurm") == [victim] and run.retries_used == 0
    assert 0 < resumed_at(second.folder) < STEPS
    assert_same_run(tmp_path, reference)
