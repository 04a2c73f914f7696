"""The platform running the real trainer (`tessera train tiny-cpu.yaml ...`, a 1-layer d_model=32 model
for 150 batches; trainer_helpers.py) on the local cluster and on the real Slurm cluster: completion, a two-node job over gloo,
kill -9 and resume, a user error at step 0, and a move from local to Slurm mid-run. A resumed or moved
run must end with the same losses and bitwise the same weights as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from platform_helpers import SlurmCluster, wait_for
from trainer_helpers import STEPS, TIMEOUT, assert_same_run, first_checkpoint, losses, spec, train_command

from tessera.platform import Platform, RunFailed

torch = pytest.importorskip("torch")


# --- the local cluster -----------------------------------------------------------------------------


def test_kill_9_mid_run_resumes_to_the_same_model(platform: Platform, tiny_data: Path, reference,
                                                  tmp_path: Path) -> None:
    platform.create_run(spec("crash", train_command(tiny_data, tmp_path)))
    first_checkpoint(tmp_path)
    beat = wait_for(lambda: platform.get_run("crash").resumptions[0].last_heartbeat, timeout=TIMEOUT,
                    what="a heartbeat")
    os.kill(int(beat["pid"]), signal.SIGKILL)
    run = platform.wait_for_run_status("crash", "COMPLETED", timeout=TIMEOUT)
    assert [r.outcome for r in run.resumptions] == ["crash", "completed"]
    assert run.resumptions[0].exit_code == 137 and run.resumptions[1].cause.startswith("retry after crash")
    assert run.retries_used == 1
    assert_same_run(tmp_path, reference)


def test_an_exception_at_step_0_fails_after_one_attempt(platform: Platform, tiny_data: Path,
                                                        tmp_path: Path) -> None:
    command = train_command(tiny_data, tmp_path, f"data.train.streams.0.remote={tmp_path}/no-such-data")
    platform.create_run(spec("baddata", command))
    with pytest.raises(RunFailed):
        platform.wait_for_run_status("baddata", "COMPLETED", timeout=TIMEOUT)
    run = platform.get_run("baddata")
    assert run.status == "FAILED" and run.failure_kind == "user_error" and run.retries_used == 0
    assert len(run.resumptions) == 1 and run.resumptions[0].exit_code not in (0, None)
    assert "no-such-data" in run.first_error, "describe should show the trainer's one-line error"


# --- the Slurm cluster -----------------------------------------------------------------------------


def test_single_node_run_on_slurm_completes(platform: Platform, slurm_cluster: SlurmCluster, tiny_data: Path,
                                            reference, tmp_path: Path) -> None:
    slurm_cluster.add_to(platform)
    platform.create_run(spec("one", train_command(tiny_data, tmp_path), cluster="slurm"))
    run = platform.wait_for_run_status("one", "COMPLETED", timeout=TIMEOUT)
    [res] = run.resumptions
    assert res.cluster == "slurm" and res.nodes[0] in slurm_cluster.nodes
    assert any(e.kind == "checkpoint" for e in run.events) and res.last_heartbeat["step"] == STEPS
    assert_same_run(tmp_path, reference)


def test_two_node_job_trains_over_gloo(platform: Platform, slurm_cluster: SlurmCluster, tiny_data: Path,
                                       tmp_path: Path) -> None:
    """One `tessera train` per node (RANK = NODE_RANK, WORLD_SIZE 2, MASTER_ADDR 127.0.0.1): a data-parallel
    job over gloo; each rank gets half of the global batch of 4."""
    slurm_cluster.add_to(platform)
    command = train_command(tiny_data, tmp_path)
    platform.create_run(spec("pair", command, cluster="slurm", nodes=2))
    run = platform.wait_for_run_status("pair", "COMPLETED", timeout=TIMEOUT)
    [res] = run.resumptions
    assert len(res.nodes) == 2 and set(res.nodes) <= set(slurm_cluster.nodes)
    final = (tmp_path / "ckpt" / "latest").read_text().strip()
    assert final.endswith(f"-ba{STEPS}") and (tmp_path / "ckpt" / final / "rank1.pt").exists(), final
    loss = losses(tmp_path)
    assert sorted(loss) == list(range(1, STEPS + 1)) and loss[STEPS] < loss[1] - 0.5
    log1 = "\n".join(platform.follow_logs("pair", rank=1, follow=False))
    assert "Traceback" not in log1


def test_move_from_local_to_slurm_mid_run_gives_the_same_run(platform: Platform, slurm_cluster: SlurmCluster,
                                                             tiny_data: Path, reference,
                                                             tmp_path: Path) -> None:
    slurm_cluster.add_to(platform)
    platform.create_run(spec("mover", train_command(tiny_data, tmp_path)))
    first_checkpoint(tmp_path)
    platform.move_run("mover", "slurm")
    run = platform.wait_for_run_status("mover", "COMPLETED", timeout=TIMEOUT)
    first, second = run.resumptions
    assert (first.cluster, first.outcome) == ("local", "moved")
    assert (second.cluster, second.cause, second.outcome) == ("slurm", "moved from local to slurm",
                                                               "completed")
    events = (Path(first.folder) / "heartbeat.json.events.jsonl").read_text().splitlines()
    moved_at = max(e.get("step", 0) for e in map(json.loads, events) if e["kind"] == "checkpoint")
    assert 0 < moved_at < STEPS, "the move should happen mid-run"
    assert_same_run(tmp_path, reference)     # same global batches, same losses, same weights
