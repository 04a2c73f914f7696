"""The supervisor's own failure windows, with real processes and the real Slurm cluster:

- killed between submitting a job and recording its id (TESSERA_SUPERVISOR_FAULT=after_submit, which
  tests/plugins/sitecustomize.py reads), the next supervisor finds the job (local: its launcher process;
  Slurm: squeue by job name) and adopts it: one job, one resumption, no step run twice;
- killed after recording the intent but before submitting (after_intent): the job is submitted once;
- node exclusion that leaves fewer nodes than the run's gang: FAILED with a cause naming the excluded
  nodes and the count needed, not a job pending forever.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from platform_helpers import FAULT_PLUGINS, SlurmCluster, steps_done, trainer_command, wait_for

from tessera.platform import Platform, RunFailed
from tessera.platform.supervision.supervisor import ensure_supervisor, supervisor_running

TIMEOUT = 60


def spec(name: str, command: str, cluster: str = "local", nodes: int = 1) -> dict:
    return {"name": name, "command": command, "compute": {"cluster": cluster, "nodes": nodes},
            "scheduling": {"max_retries": 0, "stop_grace": "5s"}}


def kill_supervisor_at(platform: Platform, monkeypatch: pytest.MonkeyPatch, point: str, run_spec: dict) -> None:
    """Submit `run_spec` with a supervisor that exits at `point` of the submission; wait until it has."""
    with monkeypatch.context() as faulty:   # the supervisor started by create_run inherits these
        faulty.setenv("TESSERA_SUPERVISOR_FAULT", point)
        faulty.setenv("PYTHONPATH", str(FAULT_PLUGINS), prepend=os.pathsep)
        run = platform.create_run(run_spec)
        # The row exists only once the supervisor holds its lock: polling the lock before that could
        # make a starting supervisor think another one runs.
        wait_for(lambda: platform.db.resumptions(run.id), timeout=TIMEOUT, what="the submission's intent")
        wait_for(lambda: not supervisor_running(platform.home), timeout=TIMEOUT, what="the supervisor to die")
    [intent] = platform.db.resumptions(run.id)
    assert intent.status == "SUBMITTING" and intent.job_id is None
    assert platform.get_run(run.id).status == "PENDING"


@pytest.mark.parametrize("cluster", ["local", "slurm"])
def test_a_job_submitted_just_before_the_supervisor_died_is_adopted(
        platform: Platform, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cluster: str,
        request: pytest.FixtureRequest) -> None:
    if cluster == "slurm":
        request.getfixturevalue("slurm_cluster").add_to(platform)
    state = tmp_path / "state"
    kill_supervisor_at(platform, monkeypatch, "after_submit",
                       spec("orphan", trainer_command(state, "--steps 12 --step-time 0.1"), cluster))
    wait_for(lambda: steps_done(state), timeout=TIMEOUT, what="the unrecorded job to train")
    if cluster == "slurm":   # found by its name in squeue, not by the id file (kept for purged jobs)
        (Path(platform.get_run("orphan").folder) / "r0" / "slurm-job-id").unlink()
    assert ensure_supervisor(platform.home)
    run = platform.wait_for_run_status("orphan", "COMPLETED", timeout=TIMEOUT)
    [res] = run.resumptions                        # adopted, not submitted a second time
    assert res.outcome == "completed" and res.job_id
    assert any(e.kind == "reconciled" and f"job {res.job_id} and adopted" in e.message for e in run.events)
    assert steps_done(state) == list(range(12))    # one trainer: no step twice, none lost
    if cluster == "slurm":
        jobs = request.getfixturevalue("slurm_cluster").run("squeue", "-h", "-t", "all", "--name=tessera-orphan-r0",
                                                            "-o", "%i").split()
        assert jobs == [res.job_id]


def test_a_submission_the_supervisor_died_before_is_made_once(platform: Platform, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    state = tmp_path / "state"
    kill_supervisor_at(platform, monkeypatch, "after_intent",
                       spec("unsent", trainer_command(state, "--steps 3 --step-time 0.05")))
    assert not steps_done(state) and not list((Path(platform.get_run("unsent").folder) / "r0").glob("node-*"))
    assert ensure_supervisor(platform.home)
    run = platform.wait_for_run_status("unsent", "COMPLETED", timeout=TIMEOUT)
    [res] = run.resumptions
    assert res.cause == "submitted" and res.outcome == "completed"
    assert any(e.kind == "reconciled" and "no job was created" in e.message for e in run.events)
    assert steps_done(state) == list(range(3))


def test_exclusion_leaving_too_few_nodes_fails_the_run_with_the_cause(
        platform: Platform, slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A gang of all three nodes; one goes down: it is excluded, two are left for a run that needs three."""
    slurm_cluster.add_to(platform)
    state = tmp_path / "state"
    platform.create_run(spec("wide", trainer_command(state, "--steps 1000 --step-time 0.05"), "slurm", nodes=3))
    wait_for(lambda: len(steps_done(state)) >= 3, timeout=TIMEOUT, what="a few steps on three nodes")
    victim = platform.get_run("wide").resumptions[0].nodes[2]
    with slurm_cluster.node_down(victim), pytest.raises(RunFailed, match="needs 3 node"):
        platform.wait_for_run_status("wide", "COMPLETED", timeout=TIMEOUT)
    run = platform.get_run("wide")
    assert run.status == "FAILED" and run.failure_kind == "insufficient_nodes"
    assert f"1 of them excluded ({victim} after 1 fault(s)" in run.first_error
    assert f"clear-node slurm {victim}" not in run.first_error and "clear-node slurm NODE" in run.first_error
    [res] = run.resumptions                         # no second job left pending
    assert res.outcome == "node_fault"
    assert platform.db.excluded_nodes("slurm") == [victim]
