"""The run lifecycle verbs MCLI users expect (delete, update, clone, list filters, convert) and `cluster
list`'s MCLI columns, on this machine's platform (no server: tests/platform/test_remote_client.py runs the
same verbs through one)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from typer.testing import CliRunner, Result

from tessera.cli.main import app
from tessera.cli.run import clone_name
from tessera.platform import Platform
from tessera.platform.spec.run_spec import validate_name

runner = CliRunner()  # the `platform` fixture: conftest.py


def tessera(*args: str, code: int = 0) -> Result:
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, (result.output, result.exception)
    return result


def listed(*args: str) -> list[dict]:
    return [json.loads(line) for line in tessera("run", "list", "--json", *args).stdout.splitlines()]


def test_update_clone_and_delete_an_active_run(platform: Platform) -> None:
    run = platform.create_run({"name": "sleeper", "command": "echo started; sleep 30",
                               "scheduling": {"stop_grace": "5s"}})
    platform.wait_for_run_status("sleeper", "RUNNING", timeout=30)
    assert "max_retries=1" in tessera("run", "update", "sleeper", "--priority", "high", "--max-retries", "1",
                                      "--max-duration", "1h30m").stderr
    scheduling = platform.get_run("sleeper").spec.scheduling
    assert (scheduling.priority, scheduling.max_retries, scheduling.max_duration) == ("high", 1, 5400.0)
    assert "priority" in tessera("run", "update", "sleeper", "--priority", "urgent", code=1).stderr
    assert "nothing to update" in tessera("run", "update", "sleeper", code=2).stderr

    tessera("run", "clone", "sleeper")
    tessera("run", "clone", "sleeper", "--name", "copy", "--gpus", "0", "--cluster", "local")
    names = [r["name"] for r in listed()]
    default = next(n for n in names if n.startswith("sleeper-clone-"))
    assert re.fullmatch(r"sleeper-clone-[0-9a-f]{4}", default) and "copy" in names
    copy = platform.get_run("copy")
    assert (copy.spec.command, copy.spec.scheduling.priority) == ("echo started; sleep 30", "high")

    assert "--yes" in tessera("run", "delete", "sleeper", code=2).stderr   # no terminal to confirm on
    assert platform.get_run("sleeper").status in ("RUNNING", "STARTING")
    for name in ("sleeper", default, "copy"):
        assert f"deleted run {name}" in tessera("run", "delete", name, "--yes").stderr
    assert listed() == [] and not Path(run.folder).exists()
    assert "no run named 'sleeper'" in tessera("run", "describe", "sleeper", code=1).stderr


def test_list_filters_by_status_cluster_and_user(platform: Platform) -> None:
    platform.create_run({"name": "good", "command": "echo ok"}, user="alice")
    platform.create_run({"name": "bad", "command": "exit 3", "scheduling": {"max_retries": 0}}, user="bob")
    platform.wait_for_run_status("good", "COMPLETED", timeout=30)
    platform.wait_for_run_status("bad", "FAILED", timeout=30)
    assert [(r["name"], r["user"]) for r in listed()] == [("bad", "bob"), ("good", "alice")]
    assert [r["name"] for r in listed("--status", "failed")] == ["bad"]
    assert [r["name"] for r in listed("--user", "alice", "--cluster", "local")] == ["good"]
    assert listed("--cluster", "elsewhere") == [] and listed("--user", "carol") == []
    table = tessera("run", "list").stdout
    assert "USER" in table and "alice" in table and "bob" in table
    assert "unknown run status 'DONE'" in tessera("run", "list", "--status", "done", code=1).stderr


def test_convert_prints_the_tessera_spec_of_an_mcli_file(tmp_path: Path) -> None:
    mcli = tmp_path / "mcli.yaml"
    mcli.write_text("run_name: mpt-125m\nimage: mosaicml/pytorch\ngpu_num: 16\ngpu_type: a100_40gb\n"
                    "command: |\n  echo one\n  echo two\nscheduling: {priority: high, max_retries: 2}\n")
    spec = yaml.safe_load(tessera("run", "convert", str(mcli)).stdout)
    assert (spec["name"], spec["command"], spec["image"]) == ("mpt-125m", "echo one\necho two\n", "mosaicml/pytorch")
    assert (spec["compute"]["nodes"], spec["compute"]["gpus_per_node"]) == (2, 8)
    assert (spec["scheduling"]["priority"], spec["scheduling"]["max_retries"]) == ("high", 2)
    mcli.write_text("run_name: x\ncommand: ls\ngpu_nmu: 8\n")
    assert "gpu_nmu" in tessera("run", "convert", str(mcli), code=1).stderr
    assert "cannot read" in tessera("run", "convert", str(tmp_path / "missing.yaml"), code=2).stderr


def test_clone_names_stay_valid_run_names() -> None:
    for name in ("a", "x" * 63, "run.v2"):
        new = clone_name(name)
        assert validate_name(new) == new and new != clone_name(name)


def test_cluster_list_shows_mcli_columns(platform: Platform) -> None:
    row = json.loads(tessera("cluster", "list", "--json").stdout)
    assert (row["name"], row["provider"], row["nodes"], row["active_runs"]) == ("local", "local", 1, 0)
    header = tessera("cluster", "list").stdout
    for column in ("NAME", "PROVIDER", "GPU TYPES", "GPUS", "INSTANCE", "NODES"):
        assert column in header
