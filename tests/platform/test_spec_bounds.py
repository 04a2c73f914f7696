"""Run spec numbers are bounded to what a run can use; anything else is a SpecError naming the key.

Without bounds `gpus_per_node: 100000000000000000000` reached torchrun, which allocates per rank, and the
supervisor retried the failure; `hang_timeout: 1e400` parsed to infinity, a hang detector that never fires.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.platform import SpecError, parse_spec
from tessera.platform.spec.run_spec import (
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    MAX_RETRIES,
    WEEK,
    YEAR,
    format_duration,
)

# key -> (section, smallest valid, largest valid)
INT_BOUNDS = {
    "nodes": ("compute", 1, MAX_NODES),
    "gpus_per_node": ("compute", 0, MAX_GPUS_PER_NODE),
    "procs_per_node": ("compute", 1, MAX_PROCS_PER_NODE),
    "max_retries": ("scheduling", 0, MAX_RETRIES),
}


def spec_with(section: str, key: str, value: object) -> str:
    return f"name: x\ncommand: ls\n{section}: {{{key}: {value}}}\n"


@given(st.sampled_from(sorted(INT_BOUNDS)), st.integers(min_value=-(2**70), max_value=2**70))
def test_integer_settings_are_accepted_exactly_within_their_bounds(key: str, value: int) -> None:
    section, low, high = INT_BOUNDS[key]
    text = spec_with(section, key, value)
    if low <= value <= high:
        assert getattr(getattr(parse_spec(text), section), key) == value
    else:
        with pytest.raises(SpecError, match=rf"{section}\.{key}: Input should be"):
            parse_spec(text)


@pytest.mark.parametrize(("section", "key", "value"), [
    ("compute", "gpus_per_node", "1e20"), ("compute", "gpus_per_node", 10**20),
    ("scheduling", "max_retries", "1e30"), ("scheduling", "max_retries", 10**30),
    ("scheduling", "hang_timeout", "1e400"), ("scheduling", "hang_timeout", ".inf"),
    ("scheduling", "hang_timeout", ".nan"), ("scheduling", "stop_grace", "8d"),
    ("scheduling", "hang_timeout", "-5m"), ("scheduling", "max_duration", "400d"),
    ("scheduling", "max_duration", "1e400"),
])
def test_the_reported_values_are_refused_naming_the_key(section: str, key: str, value: object) -> None:
    with pytest.raises(SpecError, match=rf"{section}\.{key}: "):
        parse_spec(spec_with(section, key, value))


@pytest.mark.parametrize(("key", "limit"), [("hang_timeout", WEEK), ("stop_grace", WEEK), ("max_duration", YEAR)])
def test_durations_are_accepted_up_to_their_limit(key: str, limit: float) -> None:
    assert getattr(parse_spec(spec_with("scheduling", key, format_duration(limit))).scheduling, key) == limit
    with pytest.raises(SpecError, match=rf"scheduling\.{key}: duration .* is longer than the "
                                        rf"{format_duration(limit)} allowed"):
        parse_spec(spec_with("scheduling", key, limit + 1))


def test_a_run_name_over_the_bound_names_the_value_and_the_bound(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """In the spec's error, and from `tessera run submit` as a usage error (exit 2), before any run exists."""
    from typer.testing import CliRunner

    from tessera.cli.run import app

    long = "r" * 300
    with pytest.raises(SpecError) as caught:
        parse_spec(f"name: {long}\ncommand: ls\n")
    assert str(caught.value).splitlines()[1:] == [
        f"  - name: run name '{'r' * 32}...' is 300 characters long; at most 63 are allowed"]
    assert parse_spec(f"name: {'r' * 63}\ncommand: ls\n").name == "r" * 63
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path / "home"))
    for var in ("TESSERA_API_URL", "TESSERA_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "run.yaml").write_text(f"name: {long}\ncommand: ls\n")
    result = CliRunner().invoke(app, ["submit", "-f", str(tmp_path / "run.yaml")])
    assert result.exit_code == 2 and "is 300 characters long; at most 63 are allowed" in result.output
    assert not (tmp_path / "home" / "runs").exists()
