"""`tessera train` on bad input: one red line naming the key or value, exit 2 for a wrong recipe or
override, 1 for something it names that cannot be used, no traceback, and nothing written outside the
working folder. Driven through the real CLI (typer's CliRunner), with real data and a real S3 server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from llm_helpers import assert_one_line_error
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.recipe import Recipe
from tessera.llm.recipe_keys import key_paths
from tessera.llm.recipe_required import must_be_set_message, unset_keys
from tessera.storage import open_store

runner = CliRunner()
SMALL = ["model.d_model=32", "model.n_layers=1", "model.max_seq_len=32", "global_train_batch_size=4",
         "device_train_microbatch_size=2", "data.eval.max_batches=2", "loggers=[jsonl]", "torch_threads=1",
         "max_duration=4ba", "save_interval=2ba", "eval_interval=4ba"]


def train(*args: str):
    return runner.invoke(app, ["train", *args])


@pytest.fixture
def workdir(tmp_path: Path, prepped: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder inside tmp_path, so a write outside it (run_name=../../X) would show in tmp_path."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def with_data(prepped: Path, *extra: str) -> list[str]:
    return ["tiny-cpu.yaml", *SMALL, f"data.train.streams.0.remote={prepped}",
            f"data.eval.streams.0.remote={prepped}", *extra]


@pytest.mark.parametrize(("override", "needles"), [
    ("max_duration=abc", ["max_duration", "'abc'"]),
    ("max_duration=-5ba", ["max_duration", "'-5ba'", "negative"]),
    ("save_interval=xyz", ["save_interval", "'xyz'"]),
    ("save_interval=20", ["save_interval", "'20ba'"]),
    ("optimizer.lr=-1", ["optimizer.lr", "-1"]),
    ("optimizer.lr=nan", ["optimizer.lr", "nan"]),
    ("optimizer.betas=[1.5,0.9]", ["optimizer.betas", "1.5"]),
    ("scheduler.alpha_f=.nan", ["scheduler.alpha_f", "nan"]),
    ("save_num_checkpoints_to_keep=0", ["save_num_checkpoints_to_keep", "0"]),
    ("keep=0", ["'keep'", "did you mean 'save_num_checkpoints_to_keep'"]),
    ("lr=3e-4", ["'lr'", "did you mean 'optimizer.lr'"]),
    ("loggers=[progress,neptune]", ["loggers", "'neptune'"]),
    ("data.train.streams.3.remote=./x", ["data.train.streams", "'3'"]),
    ("model=!!python/object:os.system {}", ["model=", "python/object"]),
    ("save_folder=ftp://host/ckpt", ["save_folder", "ftp://host/ckpt"]),
    ("run_name=../../X", ["run_name", "'../../X'", "path traversal"]),
])
def test_bad_values_fail_before_training_with_exit_2(workdir: Path, prepped: Path, override: str,
                                                       needles: list[str]) -> None:
    result = train(*with_data(prepped, override))
    line = assert_one_line_error(result, 2, *needles)
    assert os.listdir(workdir) == [] and os.listdir(workdir.parent) == ["work"]  # nothing started, nothing written
    # --print-config runs the very same validation, so it refuses the same value with the same line
    assert assert_one_line_error(train(*with_data(prepped, override), "--print-config"), 2) == line


def test_a_recipe_file_with_a_python_tag_is_refused(workdir: Path) -> None:
    (workdir / "evil.yaml").write_text("run_name: !!python/object/apply:os.system ['touch pwned']\n")
    assert_one_line_error(train("evil.yaml"), 2, "evil.yaml", "line 1", "python/object")
    assert not (workdir / "pwned").exists()


@pytest.mark.parametrize("key", ["data.train.streams.0.remote", "data.eval.streams.0.remote"])
def test_a_missing_local_dataset_names_the_path(workdir: Path, prepped: Path, key: str) -> None:
    result = train(*with_data(prepped, f"{key}=./no-such-data"))
    assert_one_line_error(result, 1, key.removesuffix(".0.remote"), "no-such-data")


def test_the_first_command_a_user_types_is_one_line(workdir: Path) -> None:
    assert_one_line_error(train("tiny-cpu.yaml"), 1, "data/mds")


@pytest.mark.parametrize(("args", "unset"), [
    (["mpt-125m.yaml", "data.train.streams.0.remote=s3://bucket/tokens", "optimizer.lr=3e-4"],
     ["data.eval.streams.0.remote"]),
    (["mpt-7b.yaml"], ["data.train.streams.0.remote", "data.eval.streams.0.remote", "save_folder"]),
    (["tiny-cpu.yaml", "tokenizer=???"], ["tokenizer"]),
])
def test_values_the_recipe_leaves_to_the_user_are_named_in_one_line(workdir: Path, args: list[str],
                                                                   unset: list[str]) -> None:
    """`???` in a recipe means "must be set": training names every such key with an override to copy, exit 2;
    `--print-config` shows the recipe with those values still `???` and says they must be set."""
    line = assert_one_line_error(train(*args), 2, *(f"{key} must be set (e.g. {key}=" for key in unset))
    assert line.count("must be set") == len(unset)
    shown = train(*args, "--print-config", "--json")
    assert shown.exit_code == 0, shown.output
    assert f"note: {', '.join(unset)} must be set before training" in shown.stderr
    printed = json.loads(shown.stdout)
    for key in unset:
        value: Any = printed
        for part in key.split("."):
            value = value[int(part)] if isinstance(value, list) else value[part]
        assert value == "???", key
    assert os.listdir(workdir) == []


def test_unset_keys_walks_sections_and_lists() -> None:
    tree = {"a": {"b": [{"c": "???"}, {"c": "x"}], "d": " ??? "}, "e": "???x", "f": ["???"]}
    assert unset_keys(tree) == ["a.b.0.c", "a.d", "f.0"]
    assert "a.b.0.c must be set (e.g. a.b.0.c=VALUE)" in must_be_set_message(unset_keys(tree))


def test_a_missing_s3_bucket_or_prefix_names_it(workdir: Path, prepped: Path, s3_bucket: str) -> None:
    missing_bucket = "s3://no-such-bucket-tessera-bad-input/data"
    assert_one_line_error(train(*with_data(prepped, f"data.train.streams.0.remote={missing_bucket}")), 1,
                          "data.train.streams", "no-such-bucket-tessera-bad-input")
    open_store(s3_bucket).put("other/file.txt", b"x")  # the bucket exists, the prefix does not
    assert_one_line_error(train(*with_data(prepped, f"data.train.streams.0.remote={s3_bucket}/no-such-prefix")),
                          1, f"{s3_bucket}/no-such-prefix")


def test_a_missing_or_unreadable_tokenizer_names_the_file(workdir: Path, prepped: Path) -> None:
    assert_one_line_error(train(*with_data(prepped, "tokenizer=./no-tok.json")), 1, "no-tok.json")
    (workdir / "garbage.json").write_bytes(b"\xff\xfe not a tokenizer")
    assert_one_line_error(train(*with_data(prepped, "tokenizer=garbage.json")), 1, "garbage.json")


def test_debug_shows_the_traceback(workdir: Path, prepped: Path) -> None:
    result = train(*with_data(prepped, "max_duration=abc"), "--debug")
    assert result.exit_code != 0 and result.exception is not None and not isinstance(result.exception, SystemExit)


def test_a_huge_learning_rate_stops_the_run_and_latest_stays_finite(workdir: Path, prepped: Path) -> None:
    """lr=1e30 trained to the end with a NaN loss and exit 0 before; now it stops with exit 1 and the
    `latest` checkpoint (if any was saved before the blow-up) holds finite weights only."""
    import torch

    result = train(*with_data(prepped, "optimizer.lr=1e30", "max_duration=8ba", "save_interval=1ba",
                              "log_interval=4ba"))
    assert_one_line_error(result, 1, "NaN or infinite", "optimizer.lr")
    ckpts = workdir / "runs" / "tiny-cpu" / "checkpoints"
    assert "ep0-ba8" not in {p.name for p in ckpts.glob("ep*")}  # the run stopped before its end
    latest = (ckpts / "latest").read_text().strip()  # saved before the weights overflowed
    weights = torch.load(ckpts / latest / "model.pt", map_location="cpu", weights_only=True)
    tensors = [t for t in weights.values() if torch.is_tensor(t)]
    assert tensors and all(torch.isfinite(t).all() for t in tensors)


KEYS = st.sampled_from(key_paths(Recipe) + ["lr", "keep", "data.train.streams.7", "model.n_layers", ""])
VALUES = st.one_of(st.text(max_size=30), st.sampled_from(["-5ba", "abc", "1e30", ".nan", "[1.5, 2]", "!!binary x",
                                                          "../../X", "ftp://h/x", "{a: [}", "0", "null"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.one_of(KEYS, st.text(max_size=20)), value=VALUES)
def test_any_override_fails_cleanly_and_writes_nothing_outside(tmp_path: Path, key: str, value: str) -> None:
    """No data is at the recipe's default path, so any override fails: with 2 (the override is wrong) or 1
    (the data is missing), one line, no traceback, and nothing written outside the working folder."""
    work = tmp_path / "fuzz"
    work.mkdir(exist_ok=True)
    before = sorted(os.listdir(tmp_path))
    cwd = os.getcwd()
    os.chdir(work)
    try:
        result = train("tiny-cpu.yaml", f"{key}={value}")
    finally:
        os.chdir(cwd)
    assert result.exit_code in (1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert sorted(os.listdir(tmp_path)) == before


# --print-config with several overrides at once: deeper paths, list positions past the end, YAML tags,
# anchors and garbage. It either prints a config that validates again (exit 0) or fails in one line.
SCHEMA_KEYS = key_paths(Recipe)
DEEP_KEYS = st.builds(lambda key, tail: f"{key}.{tail}", st.sampled_from(SCHEMA_KEYS),
                      st.sampled_from(["x", "0", "7", "name.deeper", "streams.0", "-1", "remote.split"]))
LIST_KEYS = st.builds(lambda section, i, field: f"data.{section}.streams.{i}.{field}",
                      st.sampled_from(["train", "eval"]), st.sampled_from(["0", "1", "99", "-1", "x", "0x0", "١"]),
                      st.sampled_from(["remote", "split", "proportion", "repeat", "choose", "nope"]))
TAGGED = st.sampled_from(["!!python/object/apply:os.system ['touch pwned']", "!!python/name:os.system",
                          "!!binary aGVsbG8=", "!!set {a, b}", "!!timestamp 2001-12-14", "!!float nan",
                          "&a [*a]", "*undefined", "!custom x", "{<<: {a: 1}}", "!!str 5", "!!int 0x1F",
                          "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]", "'unterminated", "{a: [}", "~", ""])
GARBAGE = st.one_of(TAGGED, st.text(max_size=40), st.integers(-10**30, 10**30).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["0ba", "1ba", "10ep", "1e999tok", "0.5dur", "auto", "null", "true", "[]",
                                     "{}", "s3:/b/x", "s3://b/x", "../../escape", "/abs/path", "???"]))
OVERRIDES = st.lists(st.builds(lambda key, value: f"{key}={value}",
                               st.one_of(st.sampled_from(SCHEMA_KEYS), DEEP_KEYS, LIST_KEYS, st.text(max_size=15)),
                               GARBAGE), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(overrides=OVERRIDES)
@example(overrides=["seed=5", "data.train.streams.0.remote=s3://b/x"])  # the exit-0 branch, at least once
@example(overrides=["data.eval.streams.3.remote=./x", "model=!!python/object/apply:os.system ['touch pwned']"])
@example(overrides=["max_duration=&a [*a]"])  # a list that contains itself
@example(overrides=["loggers=[[1]]"])  # an unhashable logger name
def test_print_config_under_random_overrides(tmp_path: Path, overrides: list[str]) -> None:
    """exit 0 with a config that validates again, or 1/2 with one `error:` line; never a traceback, and
    nothing written anywhere (the working folder is a fresh one inside tmp_path)."""
    import yaml

    work = tmp_path / "print-config"
    work.mkdir(exist_ok=True)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    cwd = os.getcwd()
    os.chdir(work)
    try:
        result = train("tiny-cpu.yaml", *overrides, "--print-config")
    finally:
        os.chdir(cwd)
    assert result.exit_code in (0, 1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    if result.exit_code == 0:
        Recipe.model_validate(yaml.safe_load(result.stdout))  # what was printed is a valid recipe
    elif not (result.exit_code == 2 and "No such option" in result.output):  # click's own usage error ("-x=1")
        assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1, result.output
