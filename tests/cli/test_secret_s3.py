"""`tessera secret create s3` reads the secret access key the way `secret create env` reads values (from
the environment, a file or stdin), so it need not be typed where shell history and `ps` keep it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.platform.secrets.vault import SecretStore

runner = CliRunner()
KEY = "wJalrXUtnFEMI-not-a-real-key"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path / "home"))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "S3_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "home"


def stored(home: Path, name: str) -> dict:
    """The secret's stored fields, decrypted by the platform's own store (they are encrypted on disk)."""
    return SecretStore(home).get(name).model_dump(mode="json")


def create(*args: str, **kwargs):
    return runner.invoke(app, ["secret", "create", "s3", *args], **kwargs)


def test_from_env_takes_every_variable(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEY)
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    result = create("store", "--from-env")
    assert result.exit_code == 0, result.output
    assert KEY not in result.output and "warning" not in result.output
    assert KEY in json.dumps(stored(home, "store")) and "AKIDENV" in json.dumps(stored(home, "store"))


def test_from_file_and_stdin(home: Path, tmp_path: Path) -> None:
    (tmp_path / "key.txt").write_text(KEY + "\n")
    assert create("a", "--access-key-id", "AKID", "--from-file", str(tmp_path / "key.txt")).exit_code == 0
    assert create("b", "--access-key-id", "AKID", "--stdin", input=KEY + "\n").exit_code == 0
    for name in ("a", "b"):
        assert f'"{KEY}"' in json.dumps(stored(home, name))


def test_the_old_form_still_works_with_a_warning(home: Path) -> None:
    result = create("old", "--access-key-id", "AKID", "--secret-access-key", KEY)
    assert result.exit_code == 0 and "warning" in result.output and "--from-env" in result.output


@pytest.mark.parametrize(("args", "hint"), [
    (["--access-key-id", "AKID"], "--stdin"),                           # no key and no terminal to prompt on
    (["--from-env"], "AWS_ACCESS_KEY_ID"),                               # the variables are not set
    (["--access-key-id", "AKID", "--stdin", "--from-file", "k"], "one way"),
    (["--access-key-id", "AKID", "--from-file", "/no/such/key.txt"], "/no/such/key.txt"),
])
def test_missing_or_conflicting_sources_are_one_line(args: list[str], hint: str) -> None:
    result = create("bad", *args, input="")
    assert result.exit_code in (1, 2) and "Traceback" not in result.output
    assert hint in result.output, result.output
