"""The Slurm backend against a real slurmctld and three slurmd (three virtual nodes on this host)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from platform_helpers import SlurmCluster, steps_done, trainer_command, wait_for

from tessera.platform import Platform
from tessera.platform.clusters.base import JobState, LaunchRequest
from tessera.platform.clusters.slurm import SlurmBackend
from tessera.platform.spec.run_spec import parse_spec

TIMEOUT = 60


def _request(tmp_path: Path, command: str, nodes: int = 1) -> LaunchRequest:
    spec = parse_spec(f"name: direct\ncommand: {json.dumps(command)}\ncompute: {{nodes: {nodes}}}\n"
                      "scheduling: {stop_grace: 2s}\n")
    folder = tmp_path / uuid.uuid4().hex[:8]
    folder.mkdir()
    return LaunchRequest("id", "direct", 0, folder, spec, {"RUN_NAME": "direct"}, workdir=str(tmp_path))


def _wait_state(backend: SlurmBackend, handle: dict, done: bool = True, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = backend.status(handle)
        if status.state.done == done:
            return status
        time.sleep(0.2)
    raise AssertionError(f"job {handle['job_id']} still {status.state} after {timeout} s")


def test_statuses_map(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    backend = SlurmBackend("slurm", {"slurm_conf": str(slurm_cluster.conf)})
    ok = backend.submit(_request(tmp_path, "echo fine"))
    bad = backend.submit(_request(tmp_path, "echo failing; exit 3"))
    slow = backend.submit(_request(tmp_path, "sleep 60"))
    assert _wait_state(backend, ok).state is JobState.COMPLETED
    failed = _wait_state(backend, bad)
    assert (failed.state, failed.exit_code) == (JobState.FAILED, 3)
    assert [(e.rank, e.exit_code) for e in failed.node_exits] == [(0, 3)]
    running = _wait_state(backend, slow, done=False)
    assert running.state is JobState.RUNNING and running.nodes[0] in slurm_cluster.nodes
    backend.kill(slow)
    assert _wait_state(backend, slow).state is JobState.CANCELLED
    nodes = {n.name: n for n in backend.nodes()}
    assert set(nodes) == set(slurm_cluster.nodes)


def test_two_node_gang_job(platform: Platform, slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    slurm_cluster.add_to(platform)
    command = "echo rank=$NODE_RANK nnodes=$NNODES addr=$MASTER_ADDR port=$MASTER_PORT node=$SLURMD_NODENAME"
    platform.create_run({"name": "gang", "command": command, "compute": {"cluster": "slurm", "nodes": 2}})
    run = platform.wait_for_run_status("gang", "COMPLETED", timeout=TIMEOUT)
    [res] = run.resumptions
    assert len(res.nodes) == 2 and set(res.nodes) <= set(slurm_cluster.nodes)
    lines = sorted(platform.follow_logs("gang", follow=False))
    port = lines[0].split("port=")[1].split()[0]
    assert int(port) >= 20000
    assert lines == [f"[node {r}] rank={r} nnodes=2 addr=127.0.0.1 port={port} node={res.nodes[r]}" for r in (0, 1)]
    assert list(platform.follow_logs("gang", rank=1, follow=False)) == [
        f"rank=1 nnodes=2 addr=127.0.0.1 port={port} node={res.nodes[1]}"]


def test_node_down_mid_run_is_excluded_and_the_run_resumes(platform: Platform, slurm_cluster: SlurmCluster,
                                                           tmp_path: Path) -> None:
    slurm_cluster.add_to(platform)
    state = tmp_path / "state"
    platform.create_run({"name": "nodedown", "command": trainer_command(state, "--steps 30 --step-time 0.1"),
                         "compute": {"cluster": "slurm", "nodes": 2}, "scheduling": {"max_retries": 0}})
    wait_for(lambda: len(steps_done(state)) >= 8, timeout=TIMEOUT, what="a few steps on two nodes")
    victim = platform.get_run("nodedown").resumptions[0].nodes[1]
    with slurm_cluster.node_down(victim):
        run = platform.wait_for_run_status("nodedown", "COMPLETED", timeout=TIMEOUT)
    first, second = run.resumptions
    assert first.outcome == "node_fault" and first.status == "NODE_FAIL" and victim in first.detail
    assert second.cause.startswith("retry after node_fault") and victim not in second.nodes
    assert platform.db.excluded_nodes("slurm") == [victim]
    described = {n["name"]: n for n in platform.describe_cluster("slurm")["nodes"]}
    assert described[victim]["excluded"] and described[victim]["faults"] == 1
    assert any(e.kind == "node_excluded" and victim in e.message for e in run.events)
    assert any(e.kind == "submitted" and f"excluding {victim}" in e.message for e in run.events)
    rank0 = [int(line.split()[0]) for line in (state / "steps.log").read_text().splitlines()
             if line.split()[2] == "0"]
    assert rank0 == list(range(30))          # resumed from the checkpoint: no step lost or repeated
    assert run.retries_used == 0             # a node fault does not count against max_retries


def test_stop_cancels_the_job(platform: Platform, slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    slurm_cluster.add_to(platform)
    state = tmp_path / "state"
    platform.create_run({"name": "cancelme", "command": trainer_command(state, "--steps 1000 --step-time 0.05"),
                         "compute": {"cluster": "slurm"}})
    wait_for(lambda: len(steps_done(state)) >= 3, timeout=TIMEOUT, what="a few steps")
    platform.stop_run("cancelme")
    run = platform.wait_for_run_status("cancelme", "STOPPED", timeout=TIMEOUT)
    assert run.resumptions[0].outcome == "stopped"
    assert json.loads((state / "checkpoint.json").read_text())["step"] == len(steps_done(state))
    job = run.resumptions[0].job_id
    assert "RUNNING" not in slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T")


def test_move_from_local_to_slurm_continues(platform: Platform, slurm_cluster: SlurmCluster,
                                            tmp_path: Path) -> None:
    slurm_cluster.add_to(platform)
    state = tmp_path / "state"
    platform.create_run({"name": "mover", "command": trainer_command(state, "--steps 40 --step-time 0.05"),
                         "compute": {"cluster": "local"}, "scheduling": {"stop_grace": "10s"}})
    wait_for(lambda: len(steps_done(state)) >= 5, timeout=TIMEOUT, what="a few steps on local")
    platform.move_run("mover", "slurm")
    run = platform.wait_for_run_status("mover", "COMPLETED", timeout=TIMEOUT)
    first, second = run.resumptions
    assert (first.cluster, first.outcome) == ("local", "moved")
    assert (second.cluster, second.cause, second.outcome) == ("slurm", "moved from local to slurm", "completed")
    assert second.nodes[0] in slurm_cluster.nodes and run.cluster == "slurm"
    done = (state / "steps.log").read_text().splitlines()
    assert [int(line.split()[0]) for line in done] == list(range(40))      # same steps, none twice
    moved_at = int(json.loads(next(e for e in (Path(first.folder) / "heartbeat.json.events.jsonl").read_text()
                                   .splitlines()[::-1] if '"checkpoint"' in e))["step"])
    assert {line.split()[1] for line in done[:moved_at]} == {"0"} and {line.split()[1] for line in done[moved_at:]} == {"1"}
