"""`tessera cluster add --slurm-conf` refuses a file Slurm could not read (its commands would retry it for
a minute), and `cluster describe` gives up on a silent slurmctld within a bounded wait."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.platform.clusters import slurm

runner = CliRunner()


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.parametrize("kind", ["missing", "folder", "unreadable"])
def test_a_slurm_conf_that_cannot_be_read_is_refused_at_add(tmp_path: Path, kind: str) -> None:
    conf = tmp_path / "slurm.conf"
    if kind == "folder":
        conf.mkdir()
    elif kind == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        conf.write_text("ClusterName=x\n")
        conf.chmod(0)
    result = runner.invoke(app, ["cluster", "add", "hpc", "--type", "slurm", "--slurm-conf", str(conf)])
    assert result.exit_code == 1
    assert str(conf) in error_line(result)
    assert "hpc" not in runner.invoke(app, ["cluster", "list", "--json"]).output


def test_describe_does_not_wait_for_a_silent_slurmctld(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sinfo").write_text("#!/bin/sh\nexec sleep 30\n")  # what sinfo does while slurmctld is away
    (fake / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "NODES_TIMEOUT", 0.5)
    assert runner.invoke(app, ["cluster", "add", "hpc", "--type", "slurm", "--slurm-conf", str(conf)]).exit_code == 0
    result = runner.invoke(app, ["cluster", "describe", "hpc"])
    assert result.exit_code == 0, result.output
    assert "did not answer within" in result.output and "slurmctld" in result.output


@pytest.mark.parametrize(("name", "message"), [
    ("c" * 300, f"cluster name '{'c' * 32}...' is 300 characters long; at most 63 are allowed"),
    ("Big_Box", "cluster name 'Big_Box' must be 1-63 characters of a-z, 0-9, '-', '_', '.', starting and ending "
                "with a letter or digit"),
])
def test_a_cluster_name_out_of_bounds_is_a_usage_error_in_one_line(name: str, message: str) -> None:
    result = runner.invoke(app, ["cluster", "add", name, "--type", "local"])
    assert result.exit_code == 2 and error_line(result) == f"error: {message}"
    assert runner.invoke(app, ["cluster", "add", "c" * 63, "--type", "local"]).exit_code == 0   # the bound itself
