"""What `cluster list` / `describe` show of a cluster's GPUs (MCLI's `get clusters` columns): Slurm's Gres
strings, this machine's `nvidia-smi`, and the rows of `describe_cluster`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_nvidia_smi import install, write_scenario

from tessera.platform import Platform
from tessera.platform.clusters.base import local_gpus, parse_gres


@pytest.mark.parametrize("gres,expected", [
    ("", (0, None)), ("(null)", (0, None)), ("gpu:2", (2, None)), ("gpu:a100:8(S:0-1)", (8, "a100")),
    ("gpu:h100:4,gpu:h100:4", (8, "h100")), ("nic:1,gpu:l4:1", (1, "l4")), ("gpu:tesla:x", (0, None)),
])
def test_slurm_gres_strings(gres: str, expected: tuple[int, str | None]) -> None:
    assert parse_gres(gres) == expected


def test_local_gpus_come_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert local_gpus() == (0, None)                    # no driver: no GPUs, no error
    for key, value in install(tmp_path / "bin", tmp_path / "scenarios").items():
        monkeypatch.setenv(key, value)
    write_scenario(tmp_path / "scenarios", "default", gpus=2)
    count, model = local_gpus()
    assert count == 2 and "A100" in (model or "")


def test_describe_cluster_rows_carry_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in install(tmp_path / "bin", tmp_path / "scenarios").items():
        monkeypatch.setenv(key, value)
    write_scenario(tmp_path / "scenarios", "default", gpus=4)
    platform = Platform(tmp_path / "home")
    [node] = platform.describe_cluster("local")["nodes"]
    assert node["gpus"] == 4 and "A100" in node["gpu_type"] and node["cpus"]
    platform.close()
