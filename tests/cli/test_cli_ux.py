"""Issue 26, sections 1-4, as a person at an 80-column terminal meets them: lists that fit (the run's
whole name on one line), `run describe` as YAML-like sections (no `{'`, no `None`), `tessera train --help`
on one screen with every key one flag away, examples at the end of every command's help, and syntax errors
that name the line and show it with a caret. In process (CliRunner), one real run on the local cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from tessera.cli.examples import EXAMPLES
from tessera.cli.main import app
from tessera.cli.output import GAP, Column, render
from tessera.llm.recipe import Recipe
from tessera.llm.recipe_keys import recipe_keys
from tessera.platform import Platform
from tessera.shards.errors import IndexFormatError
from tessera.shards.index import DatasetIndex
from tessera.suggest import hint

LONG_NAME = "a-rather-long-run-name-for-the-experiment-2026-12-03-lr-3e-4"
BOX = set("─│┃━┏┓┗┛┡┩┠┨╭╮╰╯┌┐└┘├┤┬┴┼═║")
runner = CliRunner()


def cli(*args: str, code: int = 0, columns: int = 80) -> Result:
    result = runner.invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert result.exit_code == code, (result.output, result.exception)
    assert "Traceback" not in result.output
    return result


def error_lines(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


# --- 1, 2: lists fit the terminal; describe reads like kubectl describe -------------------------------------

def test_a_long_run_name_fits_on_one_line_at_80_columns_and_describe_has_no_python(platform: Platform) -> None:
    platform.create_run({"name": LONG_NAME, "command": "echo one\necho two",
                         "env": {"LR": "3e-4"}, "parameters": {"lr": 3e-4, "warmup": None}})
    platform.wait_for_run_status(LONG_NAME, "COMPLETED", timeout=60)
    platform.secrets.create("env", "hf-token", values={"HF_TOKEN": "x"})

    listing = cli("run", "list").stdout.splitlines()
    assert listing[0].split() == ["NAME", "STATUS", "CLUSTER"] and len(listing) == 2
    assert listing[1].split() == [LONG_NAME, "COMPLETED", "local"]
    wide = cli("run", "list", "--wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "STATUS", "CLUSTER", "USER", "GPUS", "NODES", "RESUMPTIONS", "CREATED"]
    assert len(wide[1]) > 80 and re.search(r"  1  +\d\d-\d\d \d\d:\d\d$", wide[1])
    (row,) = [json.loads(line) for line in cli("run", "list", "--json").stdout.splitlines()]
    assert cli("run", "list", "--format", "json").stdout == cli("run", "list", "--json").stdout
    assert row["name"] == LONG_NAME and {"created", "updated", "ended", "user", "gpus", "nodes"} <= set(row)
    outputs = [cli(*args).stdout for args in (["run", "list"], ["cluster", "list"], ["secret", "list"],
                                              ["cluster", "describe", "local"])]
    for output in outputs:
        assert output and not BOX & set(output) and max(map(len, output.splitlines())) <= 80, output
    assert error_lines(cli("run", "list", "--format", "yaml", code=2)) == [
        "error: --format 'yaml': choose one of table, plain, json"]

    text = cli("run", "describe", LONG_NAME).stdout
    assert "{'" not in text and "None" not in text and "null" not in text
    top = [line.split(":", 1)[0] for line in text.splitlines() if line and not line.startswith(" ")]
    assert [key for key in top if key != "supervisor"] == ["name", "id", "status", "cluster", "user", "created", "ended", "folder", "spec", "compute",
                   "scheduling", "resumptions", "checkpoints", "logs", "events"]
    assert "  command: |\n    echo one\n    echo two\n" in text and "    lr: 0.0003\n" in text
    assert re.search(r"\n  - #0 on local\n    cause: +submitted\n", text)
    assert "  max duration:            no limit\n" in text
    assert json.loads(cli("run", "describe", LONG_NAME, "--json").stdout)["spec"]["parameters"]["warmup"] is None


def test_list_users_fits_and_json_stays_whole(tmp_path: Path) -> None:
    cli("server", "admin", "create-user", "a-user-whose-name-is-long-enough-to-matter", "--team", "ml",
        "--home", str(tmp_path))
    listing = cli("server", "admin", "list-users", "--home", str(tmp_path), columns=66).stdout.splitlines()
    assert listing[0].split() == ["USER", "TEAM", "KEYS"] and max(map(len, listing)) <= 66   # ADMIN gave way
    assert re.fullmatch(r"a-user-whose-name-is-long-enough-to-matter  ml    tsk_\S{8}", listing[1])
    (user,) = json.loads(cli("server", "admin", "list-users", "--home", str(tmp_path), "--json").stdout)
    assert (user["name"], user["team"], len(user["keys"])) == ("a-user-whose-name-is-long-enough-to-matter", "ml", 1)


CELL = st.text(st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"]), max_size=30)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), ncols=st.integers(1, 7), nrows=st.integers(0, 6), width=st.integers(1, 160))
def test_the_table_fitter_never_overflows_nor_cuts_the_name(data: st.DataObject, ncols: int, nrows: int,
                                                            width: int) -> None:
    """Never wider than `width` when the name column fits in it; the name is never cut; whatever is cut
    ends in `…`; the header names the columns kept, in order."""
    columns = [Column("NAME", 0)] + [
        Column(data.draw(st.text("ABCDEFGHIJ", min_size=1, max_size=9)), data.draw(st.integers(1, 5)),
               min_width=data.draw(st.none() | st.integers(1, 8))) for _ in range(ncols - 1)]
    names = data.draw(st.lists(st.text("abcdefghij-.", min_size=1, max_size=40), min_size=nrows, max_size=nrows))
    rows = [[name, *(data.draw(CELL) for _ in range(ncols - 1))] for name in names]
    lines = [line.plain for line in render(columns, rows, width)]
    name_width = max([4, *map(len, names)])
    if name_width <= width:
        assert all(len(line) <= width for line in lines), (width, lines)
    for name, line in zip(names, lines[1:], strict=True):
        assert line == name or line.startswith(name.ljust(name_width) + " " * GAP)
    headers = lines[0].split()
    assert headers[0] == "NAME" and all(h in [c.header for c in columns] or h.endswith("…") for h in headers)
    wide = [line.plain for line in render(columns, rows, width, wide=True)]
    assert wide[0].split() == [c.header for c in columns] and "…" not in "".join(wide[1:])


# --- 3: help that helps --------------------------------------------------------------------------------------

def test_train_help_is_one_screen_and_every_key_is_one_flag_away() -> None:
    short = cli("train", "--help").stdout
    assert len(short.splitlines()) <= 80 and "--list-keys" in short and "--help-all" in short
    assert "--efficiency" not in short and "Examples:" in short and "save_keep_every_n" not in short
    keys = cli("train", "tiny-cpu.yaml", "--list-keys").stdout
    for key, kind, _, _ in recipe_keys(Recipe):
        assert f"\n  {key}  ({kind}; default " in keys, key
    assert re.search(r"\noptimizer:  # .+\n(  .+\n)*  optimizer\.lr  \(float; default 0\.0006\)\n      The peak learning rate\.\n", keys)
    everything = cli("train", "--help-all").stdout
    assert "--efficiency" in everything and "--gpus-per-node" in everything and keys.strip() in everything


def _commands(command: Any, path: tuple[str, ...], ctx: Any) -> list[tuple[tuple[str, ...], Any]]:
    """(path, command) of `tessera` and every command under it."""
    found = [(path, command)]
    for name in getattr(command, "list_commands", lambda _: [])(ctx):
        sub = command.get_command(ctx, name)
        found += _commands(sub, (*path, name), type(ctx)(sub, parent=ctx, info_name=name))
    return found


def test_every_command_ends_its_help_with_examples_of_itself() -> None:
    """Each command's help ends with its examples, and each example calls that command with options it
    has (a renamed option or command fails here, not in a user's terminal)."""
    root = typer.main.get_command(app)
    commands = _commands(root, (), root.make_context("tessera", ["--help"], resilient_parsing=True))
    assert len(commands) > 60 and set(EXAMPLES) == {" ".join(path) for path, _ in commands}
    by_path = dict(commands)
    for path, command in commands:
        assert command.epilog and command.epilog.startswith("Examples:\n$ "), path
        for example in EXAMPLES[" ".join(path)]:
            words = example.split("tessera ", 1)[1].split()
            assert words[:len(path)] == list(path), example
            called = max((p for p in by_path if list(p) == words[:len(p)]), key=len)  # a group's example
            options = {opt for param in by_path[called].params for opt in param.opts if opt.startswith("-")}
            used = {w.split("=")[0] for w in words if w.startswith("-")}
            assert used <= options, (example, used - options)
    shown = [line.rstrip() for line in cli("run", "describe", "--help").stdout.rstrip().splitlines()]
    assert shown[-2:] == [" $ tessera run describe gpt-tiny", " $ tessera run describe gpt-tiny --json"]


# --- 4: errors point at the line -----------------------------------------------------------------------------

def test_a_recipe_syntax_error_names_line_3_with_a_caret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text("max_duration: 10ba\nmodel:\n  name: tiny: x\nseed: 1\n")
    for args in (["train", "bad.yaml"], ["train", "bad.yaml", "--print-config"]):
        result = cli(*args, code=2)
        (line,) = error_lines(result)
        assert line == "error: bad.yaml: not valid plain YAML: mapping values are not allowed here (line 3, column 13)"
        assert result.output.splitlines()[1:] == ["    3 |   name: tiny: x", "      |             ^"]
    Path("bad.yaml").write_text("max_duration: 10ba\nmodel:\n  name: [tiny\nseed: 1\n")  # noticed on line 4
    result = cli("train", "bad.yaml", code=2)
    assert error_lines(result) == ["error: bad.yaml: not valid plain YAML: expected ',' or ']', but got ':' on line 4 "
                                   "(while parsing a flow sequence that starts here) (line 3, column 9)"]
    assert result.output.splitlines()[1:] == ["    3 |   name: [tiny", "      |         ^",
                                              "    4 | seed: 1", "      |     ^"]
    assert not list(tmp_path.glob("*/"))  # nothing was started


def test_run_spec_and_index_syntax_errors_name_their_line(platform: Platform, tmp_path: Path) -> None:
    spec = tmp_path / "run.yaml"
    spec.write_text("name: x\ncommand: ls\ncompute: {cluster: local\n")
    result = cli("run", "submit", "-f", str(spec), code=2)
    assert error_lines(result) == [f"error: {spec}: not valid YAML: expected ',' or '}}', but got '<stream end>' "
                                   "on line 4 (while parsing a flow mapping that starts here) (line 3, column 10)"]
    assert result.output.splitlines()[1:] == ["    3 | compute: {cluster: local", "      |          ^"]

    text = '{\n  "shards": [\n    {"basename": "a.mds",}\n  ],\n  "version": 2\n}\n'
    with pytest.raises(IndexFormatError) as caught:
        DatasetIndex.from_json(text.encode(), "ds/index.json")
    assert str(caught.value) == ("ds/index.json: not valid JSON: Expecting property name enclosed in double "
                                 "quotes (line 3, column 26)")
    assert caught.value.excerpt == '\n    3 |     {"basename": "a.mds",}\n      |                          ^'
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "index.json").write_text(text)
    shown = cli("data", "inspect", str(tmp_path / "ds"), code=1).output.splitlines()
    assert len(shown) == 3 and shown[0].startswith("error: ") and shown[0].endswith("(line 3, column 26)")


def test_a_long_jsonl_record_is_shown_around_its_error(tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text('{"text": "ok"}\n{"text": "' + "x" * 200 + '" "y"}\n')
    result = cli("data", "convert", str(source), str(tmp_path / "out"), code=1)
    head, line, caret = result.output.splitlines()
    assert head == f"error: {source}, line 2: bad JSON: Expecting ',' delimiter (column 213)"
    assert line.startswith("    | …") and len(line) < 90 and caret.index("^") == line.index('" "y"') + 2


def test_one_did_you_mean_for_every_layer() -> None:
    assert hint("lrr", ["lr", "betas"]) == "; did you mean 'lr'?"
    assert hint("zzz", ["lr", "betas"]) == "" and hint("zzz", ["lr"], list_known=True) == "; known keys: lr"
    assert hint("shufle", ["shuffle"], prefix="data.train.") == "; did you mean 'data.train.shuffle'?"


def test_the_lease_option_default_is_the_stores() -> None:
    """cli/server.py keeps its own copy of the default (every `tessera` command loads it, the store is
    not imported there): the two must not drift apart."""
    from tessera.cli.server import DEFAULT_LEASE_SECONDS as shown
    from tessera.platform.store.leases import DEFAULT_LEASE_SECONDS

    assert shown == DEFAULT_LEASE_SECONDS
