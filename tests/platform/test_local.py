"""The local cluster with real processes and a real (detached) supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from platform_helpers import steps_done, trainer_command, wait_for

from tessera.platform import Platform, RunFailed
from tessera.platform.supervision.supervisor import ensure_supervisor, stop_supervisor, supervisor_running

TIMEOUT = 30


def spec(name: str, command: str, **scheduling) -> dict:
    return {"name": name, "command": command, "compute": {"cluster": "local"},
            "scheduling": {"max_retries": 2, "stop_grace": "2s", **scheduling}}


def trainer_pid(state: Path) -> int:
    return int(wait_for(lambda: (state / "pid-0").exists() and (state / "pid-0").read_text(), what="pid file"))


def test_run_completes_with_injected_env_and_parameters(platform: Platform, tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    command = (f"{sys.executable} -c \"import json, os; json.dump({{k: os.environ.get(k) for k in "
               f"['RUN_NAME', 'TESSERA_RUN_ID', 'TESSERA_HEARTBEAT', 'TESSERA_PARAMETERS', 'NODE_RANK', "
               f"'NNODES', 'MASTER_ADDR', 'MASTER_PORT', 'FOO']}}, open('{out}', 'w'))\"")
    run = platform.create_run({**spec("hello", command), "env": {"FOO": "bar"}, "parameters": {"lr": 0.5}})
    run = platform.wait_for_run_status("hello", "COMPLETED", timeout=TIMEOUT)
    seen = json.loads(out.read_text())
    assert seen["RUN_NAME"] == "hello" and seen["TESSERA_RUN_ID"] == run.id and seen["FOO"] == "bar"
    assert seen["NODE_RANK"] == "0" and seen["NNODES"] == "1" and seen["MASTER_ADDR"] == "127.0.0.1"
    assert Path(seen["TESSERA_PARAMETERS"]).read_text().strip() == "lr: 0.5"
    assert seen["TESSERA_HEARTBEAT"].endswith("r0/heartbeat.json")
    [res] = run.resumptions
    assert (res.cause, res.outcome, res.exit_code, res.cluster) == ("submitted", "completed", 0, "local")
    assert res.start is not None and res.end is not None and res.nodes


def test_trainer_heartbeats_and_checkpoint_events_are_recorded(platform: Platform, tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform.create_run(spec("beats", trainer_command(state, "--steps 5 --step-time 0.3")))
    run = platform.wait_for_run_status("beats", "RUNNING", timeout=TIMEOUT)
    assert run.status in ("RUNNING", "COMPLETED")
    run = platform.wait_for_run_status("beats", "COMPLETED", timeout=TIMEOUT)
    assert run.resumptions[0].last_heartbeat["step"] == 5
    kinds = [e.kind for e in run.events]
    assert "fit_start" in kinds and "fit_end" in kinds and kinds.count("checkpoint") == 5
    assert steps_done(state) == list(range(5))


def test_user_error_fails_at_once_with_first_exception(platform: Platform, tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform.create_run(spec("oops", trainer_command(state, "--fault error --at 0")))
    with pytest.raises(RunFailed):
        platform.wait_for_run_status("oops", "COMPLETED", timeout=TIMEOUT)
    run = platform.get_run("oops")
    assert run.status == "FAILED" and run.failure_kind == "user_error"
    assert run.first_error == "ValueError: bad value at step 0"
    assert len(run.resumptions) == 1 and run.resumptions[0].exit_code == 1
    assert run.retries_used == 0


def test_kill_9_is_retried_and_resumes_from_checkpoint(platform: Platform, tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform.create_run(spec("crash", trainer_command(state, "--steps 6 --fault crash --at 3")))
    wait_for(lambda: (state / "fault-crash.done").exists(), what="the crash point")
    os.kill(trainer_pid(state), signal.SIGKILL)
    run = platform.wait_for_run_status("crash", "COMPLETED", timeout=TIMEOUT)
    assert [r.outcome for r in run.resumptions] == ["crash", "completed"]
    assert run.resumptions[0].exit_code == 137 and "SIGKILL" in run.resumptions[0].detail
    assert run.resumptions[1].cause.startswith("retry after crash")
    assert steps_done(state) == list(range(6))      # resumed at the checkpoint: nothing lost or repeated
    assert run.retries_used == 1


def test_hang_is_detected_killed_and_retried(platform: Platform, tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform.create_run(spec("hang", trainer_command(state, "--steps 6 --fault hang --at 2"),
                             hang_timeout="1.5s", stop_grace="1s"))
    run = platform.wait_for_run_status("hang", "COMPLETED", timeout=TIMEOUT)
    assert [r.outcome for r in run.resumptions] == ["hang", "completed"]
    assert run.resumptions[0].exit_code == 137      # it ignored SIGTERM: killed after the grace period
    kinds = [e.kind for e in run.events]
    assert "hang" in kinds and "stopping" in kinds
    assert steps_done(state) == list(range(6))


def test_oom_signature_is_classified_and_retried(platform: Platform, tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform.create_run(spec("oom", trainer_command(state, "--steps 4 --fault oom --at 2")))
    run = platform.wait_for_run_status("oom", "COMPLETED", timeout=TIMEOUT)
    assert [r.outcome for r in run.resumptions] == ["oom", "completed"]


def test_retries_are_bounded(platform: Platform, tmp_path: Path) -> None:
    platform.create_run(spec("doomed", "sleep 0.2; kill -9 $$", max_retries=1))
    with pytest.raises(RunFailed, match="gave up after 1 retry"):
        platform.wait_for_run_status("doomed", "COMPLETED", timeout=TIMEOUT)
    assert [r.outcome for r in platform.get_run("doomed").resumptions] == ["crash", "crash"]


def test_stop_is_graceful(platform: Platform, tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform.create_run(spec("stopme", trainer_command(state, "--steps 1000 --step-time 0.05")))
    wait_for(lambda: len(steps_done(state)) >= 3, what="a few steps")
    platform.stop_run("stopme")
    run = platform.wait_for_run_status("stopme", "STOPPED", timeout=TIMEOUT)
    assert run.resumptions[-1].outcome == "stopped"
    checkpoint = json.loads((state / "checkpoint.json").read_text())["step"]
    assert checkpoint == len(steps_done(state))       # it checkpointed every finished step on SIGTERM


def test_restart_after_stop_continues(platform: Platform, tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform.create_run(spec("again", trainer_command(state, "--steps 30 --step-time 0.05")))
    wait_for(lambda: len(steps_done(state)) >= 3, what="a few steps")
    platform.stop_run("again")
    platform.wait_for_run_status("again", "STOPPED", timeout=TIMEOUT)
    platform.restart_run("again")
    run = platform.wait_for_run_status("again", "COMPLETED", timeout=TIMEOUT)
    assert [r.cause for r in run.resumptions] == ["submitted", "restarted on request"]
    assert steps_done(state) == list(range(30))


def test_supervisor_restart_picks_up_where_it_was(platform: Platform, tmp_path: Path) -> None:
    state = tmp_path / "state"
    platform.create_run(spec("survivor", trainer_command(state, "--steps 8 --step-time 0.1 --fault crash --at 3")))
    wait_for(lambda: (state / "fault-crash.done").exists(), what="the crash point")
    # the supervisor marks RUNNING on its next poll after the first heartbeat: wait for it (no race)
    wait_for(lambda: platform.get_run("survivor").status == "RUNNING", what="the run to be RUNNING")
    assert stop_supervisor(platform.home)
    assert not supervisor_running(platform.home)
    os.kill(trainer_pid(state), signal.SIGKILL)     # the failure happens while nobody watches
    time.sleep(0.5)
    assert platform.get_run("survivor").status == "RUNNING"
    assert ensure_supervisor(platform.home)
    run = platform.wait_for_run_status("survivor", "COMPLETED", timeout=TIMEOUT)
    assert [r.outcome for r in run.resumptions] == ["crash", "completed"]
    assert run.resumptions[0].exit_code == 137
    assert steps_done(state) == list(range(8))


def test_supervisor_survives_the_cli(platform: Platform, tmp_path: Path) -> None:
    """`tessera run submit` returns at once; the detached supervisor finishes the run."""
    state = tmp_path / "state"
    (tmp_path / "run.yaml").write_text(
        f"name: detached\ncommand: {trainer_command(state, '--steps 5')}\nscheduling: {{max_retries: 0}}\n")
    done = subprocess.run([sys.executable, "-m", "tessera.cli.main", "run", "submit", "-f", str(tmp_path / "run.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "submitted run detached" in done.stderr
    run = platform.wait_for_run_status("detached", "COMPLETED", timeout=TIMEOUT)
    assert len(run.resumptions) == 1


def test_several_ranks_per_node_go_through_torchrun(platform: Platform, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    command = "echo rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE node=$NODE_RANK"
    platform.create_run({**spec("ranks", command), "compute": {"cluster": "local", "procs_per_node": 2}})
    platform.wait_for_run_status("ranks", "COMPLETED", timeout=60)
    lines = list(platform.follow_logs("ranks", follow=False))
    assert "[default0]:rank=0 local=0 world=2 node=0" in lines
    assert "[default1]:rank=1 local=1 world=2 node=0" in lines
    assert list(platform.follow_logs("ranks", rank=1, follow=False)) == ["[default1]:rank=1 local=1 world=2 node=0"]
