"""The `tessera run|cluster|secret` commands, end to end through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tessera.platform import Platform

CLI = [sys.executable, "-m", "tessera.cli.main"]


def tessera(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def test_submit_follow_describe_list(platform: Platform, tmp_path: Path) -> None:
    spec = tmp_path / "run.yaml"
    spec.write_text("name: cli-run\ncommand: echo hello from $RUN_NAME; echo step 2\n")
    done = tessera("run", "submit", "-f", str(spec), "--follow")
    assert done.stdout.splitlines() == ["hello from cli-run", "step 2"]
    assert "run cli-run: COMPLETED" in done.stderr
    listed = [json.loads(line) for line in tessera("run", "list", "--json").stdout.splitlines()]
    assert [(r["name"], r["status"], r["resumptions"]) for r in listed] == [("cli-run", "COMPLETED", 1)]
    described = json.loads(tessera("run", "describe", "cli-run", "--json").stdout)
    assert described["resumptions"][0]["outcome"] == "completed"
    assert "cli-run" in tessera("run", "describe", "cli-run").stdout
    assert tessera("run", "logs", "cli-run", "--resumption", "0").stdout == "hello from cli-run\nstep 2\n"


def test_submit_refuses_an_invalid_spec(platform: Platform, tmp_path: Path) -> None:
    spec = tmp_path / "run.yaml"
    spec.write_text("name: x\ncommand: ls\nscheduling: {max_retires: 2}\n")
    done = tessera("run", "submit", "-f", str(spec), ok=False)
    assert done.returncode == 2 and "did you mean 'max_retries'" in done.stderr   # a usage error
    spec.write_text("name: x\ncommand: ls\nsecrets: [nope]\n")
    assert "nope" in tessera("run", "submit", "-f", str(spec), ok=False).stderr
    assert tessera("run", "list", "--json").stdout == ""


def test_failed_follow_exits_non_zero_and_stop_of_finished_run(platform: Platform, tmp_path: Path) -> None:
    spec = tmp_path / "run.yaml"
    spec.write_text("name: bad\ncommand: exit 3\nscheduling: {max_retries: 0}\n")
    done = tessera("run", "submit", "-f", str(spec), "--follow", ok=False)
    assert done.returncode == 1 and "FAILED" in done.stderr
    assert "FAILED" in tessera("run", "stop", "bad").stderr


def test_cluster_and_secret_commands(platform: Platform, tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text("ClusterName=farm\n")  # a missing slurm.conf is refused at add
    tessera("cluster", "add", "farm", "--type", "slurm", "--partition", "gpu", "--account", "ml",
            "--slurm-conf", str(tmp_path / "slurm.conf"))
    clusters = {c["name"]: c for c in map(json.loads, tessera("cluster", "list", "--json").stdout.splitlines())}
    assert clusters["farm"].items() >= {"name": "farm", "type": "slurm", "partition": "gpu", "account": "ml",
                                        "slurm_conf": str(tmp_path / "slurm.conf")}.items()
    assert clusters["local"]["type"] == "local"
    assert "exists" in tessera("cluster", "add", "farm", "--type", "slurm", ok=False).stderr
    assert tessera("cluster", "add", "x", "--type", "mainframe", ok=False).returncode == 1
    local = json.loads(tessera("cluster", "describe", "local", "--json").stdout)
    assert local["nodes"][0]["healthy"] is True
    tessera("cluster", "remove", "farm")
    assert "farm" not in tessera("cluster", "list").stdout

    tessera("secret", "create", "env", "tok", "A=secret-value-1", "B=secret-value-2")
    tessera("secret", "create", "s3", "r2", "--access-key-id", "AKID", "--secret-access-key", "secret-value-3",
            "--endpoint", "http://127.0.0.1:1")
    listing = tessera("secret", "list").stdout + tessera("secret", "list", "--json").stdout
    assert "tok" in listing and "r2" in listing and "secret-value" not in listing
    tessera("secret", "remove", "tok")
    assert "tok" not in tessera("secret", "list", "--json").stdout
