"""Run spec validation: every problem at once, with did-you-mean and refusals of path tricks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.platform import SpecError, load_spec, parse_spec
from tessera.platform.spec.run_spec import format_duration, parse_duration

EXAMPLE = """
name: gpt-tiny
command: tessera train tiny-cpu.yaml save_folder=s3://bucket/runs/$RUN_NAME/checkpoints
compute: {cluster: local, nodes: 1, gpus_per_node: 0, cpus_per_node: 2}
env: {FOO: bar, N: 3}
secrets: [r2-creds]
scheduling: {max_retries: 5, retry_on_system_failure: true, max_duration: 12h, priority: normal,
             hang_timeout: 10m}
parameters: {model: {d: 64}, lr: 0.001}
"""


def test_the_issue_example_is_valid() -> None:
    spec = parse_spec(EXAMPLE)
    assert spec.name == "gpt-tiny" and spec.compute.cpus_per_node == 2 and spec.env == {"FOO": "bar", "N": "3"}
    assert spec.scheduling.max_duration == 12 * 3600 and spec.scheduling.hang_timeout == 600
    assert spec.parameters == {"model": {"d": 64}, "lr": 0.001}
    assert parse_spec(spec.to_yaml()) == spec          # what is stored round-trips


def test_unknown_keys_get_did_you_mean_and_all_problems_are_listed() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec("name: x\ncommand: ls\ncompute: {gpus_per_nod: 1}\nschedulng: {}\n"
                   "scheduling: {max_duration: 12x, priority: urgent}\nenv: {RUN_NAME: a}\n")
    message = str(info.value)
    assert "compute.gpus_per_nod: unknown key; did you mean 'gpus_per_node'?" in message
    assert "schedulng: unknown key; did you mean 'scheduling'?" in message
    assert "scheduling.max_duration: duration '12x' is not understood" in message
    assert "scheduling.priority" in message
    assert "RUN_NAME is set by Tessera" in message


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", ".hidden", "x\\y", "Upper", "-dash", "a" * 64, ""])
def test_names_that_could_escape_a_folder_are_refused(name: str) -> None:
    with pytest.raises(SpecError, match="name"):
        parse_spec(f"name: '{name}'\ncommand: ls\n")


def test_missing_and_wrong_types(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="command: required"):
        parse_spec("name: x\n")
    with pytest.raises(SpecError, match="nodes"):
        parse_spec("name: x\ncommand: ls\ncompute: {nodes: 0}\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        parse_spec("name: [\n")
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


@pytest.mark.parametrize("text,seconds", [("12h", 43200), ("10m", 600), ("1h30m", 5400), ("45s", 45),
                                          ("2d", 172800), ("500ms", 0.5), ("90", 90), (1.5, 1.5)])
def test_durations(text, seconds) -> None:
    assert parse_duration(text) == seconds


@given(st.integers(min_value=1, max_value=10**7))
def test_format_duration_round_trips(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
