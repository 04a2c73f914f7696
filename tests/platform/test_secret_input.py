"""`tessera secret create env` takes values from the environment, files or stdin, not the command line.

A value in argv is in shell history and in `ps` for every user; the old `KEY=VALUE` form still works but
warns. Errors name the variable, file or line and never echo a value.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_secret_types import isolated_home
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.platform import SecretError
from tessera.platform.secrets.input import parse_env_lines, values_from_environ, values_from_files
from tessera.platform.secrets.vault import SecretStore

TOKEN = "tok-3f9a=b#c d"  # '=', '#' and a space survive every path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return isolated_home(monkeypatch, tmp_path / "home")


def create(*args: str, stdin: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["secret", "create", "env", "api", *args], input=stdin)
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.usefixtures("home")
def test_values_from_the_environment_a_file_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_TOKEN", TOKEN)
    monkeypatch.setenv("LOCAL_NAME", "renamed")
    (tmp_path / "key.txt").write_text("from-file\n")
    code, output = create("--from-env", "API_TOKEN", "--from-env", "OTHER=LOCAL_NAME",
                          "--from-file", f"KEY={tmp_path / 'key.txt'}", "--stdin",
                          stdin="# comment\n\nexport PIPED=piped value\n")
    assert code == 0, output
    assert "warning" not in output and TOKEN not in output
    assert SecretStore().get("api").env() == {"API_TOKEN": TOKEN, "OTHER": "renamed", "KEY": "from-file",
                                              "PIPED": "piped value"}


@pytest.mark.usefixtures("home")
def test_the_old_form_still_works_with_a_warning() -> None:
    code, output = create(f"API_TOKEN={TOKEN}")
    assert code == 0 and "warning:" in output and "shell history" in output and TOKEN not in output
    assert SecretStore().get("api").env() == {"API_TOKEN": TOKEN}


@pytest.mark.usefixtures("home")
@pytest.mark.parametrize(("args", "stdin", "expected"), [
    (("--from-env", "NOT_SET_ANYWHERE"), None, "--from-env NOT_SET_ANYWHERE: the environment variable"),
    (("--from-file", "KEY=/nonexistent/key.txt"), None, "cannot read /nonexistent/key.txt"),
    (("--stdin",), f"{TOKEN}\n", "stdin line 1: the name before '=' is not a valid"),
    (("--stdin",), "tok-3f9a\n", "stdin line 1: expected KEY=VALUE"),
    (("--stdin",), "", "no KEY=VALUE given"),
    (("--stdin", "--from-env", "HOME"), "HOME=x\n", "HOME is given twice"),
    (("API_TOKEN",), None, "argument 1: expected KEY=VALUE"),
])
def test_bad_values_fail_in_one_line_without_echoing_a_value(args: tuple[str, ...], stdin: str | None,
                                                              expected: str) -> None:
    code, output = create(*args, stdin=stdin)
    assert code == 2 and output.startswith("error:") and expected in output, output
    assert TOKEN not in output and "Traceback" not in output
    assert SecretStore().list() == []


def test_no_values_at_all_is_a_usage_error(home: Path) -> None:
    code, output = create()
    assert code == 2 and "--from-env" in output


@given(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True),
                       st.text(st.characters(exclude_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                               max_size=12).map(str.strip)))
def test_env_lines_round_trip(values: dict[str, str]) -> None:
    text = "".join(f"{key}={value}\n" for key, value in values.items())
    assert parse_env_lines(text) == values


@given(st.text(max_size=40))
def test_any_text_is_values_or_a_secret_error(text: str) -> None:
    try:
        values = parse_env_lines(text)
    except SecretError as err:
        assert str(err).startswith("stdin line ")
        return
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) for key in values)


def test_environ_and_files_name_what_is_wrong(tmp_path: Path) -> None:
    assert values_from_environ(["A=B"], {"B": "v"}) == {"A": "v"}
    with pytest.raises(SecretError, match="--from-env 1A: the name before '=' is not a valid"):
        values_from_environ(["1A"], {"1A": "v"})
    (tmp_path / "crlf").write_bytes(b"value\r\n")
    assert values_from_files([f"K={tmp_path / 'crlf'}"]) == {"K": "value"}
    with pytest.raises(SecretError, match="expected KEY=PATH"):
        values_from_files(["K"])
