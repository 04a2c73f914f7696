"""Secrets: encrypted at rest in the store (Fernet; key from TESSERA_SECRET_KEY, TESSERA_SECRET_KEY_FILE or
<home>/secret.key made 0600), imported from the old plaintext layout, injected into runs, never shown."""

from __future__ import annotations

import base64
import json
import math
import re
import stat
import sys
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from test_secret_types import isolated_home
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.platform import Platform, SecretError
from tessera.platform.secrets.crypto import _create_key_file
from tessera.platform.secrets.redaction import MIN_BASE64_LEN, REDACTED, Redactor
from tessera.platform.secrets.types import MAX_FILENAME_BYTES
from tessera.platform.secrets.vault import FileSecret, SecretInputError, SecretStore
from tessera.platform.spec.schema import shorten

ENV_VALUE = "tok-8c1f2e9d7b"
S3_SECRET = "s3-secret-5a4b3c2d1e"
FILE_LINE = "file-secret-line-77e0f"
VALUES = (ENV_VALUE, S3_SECRET, FILE_LINE)


@pytest.fixture(autouse=True)
def no_outside_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolated_home(monkeypatch, tmp_path / "home")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


def fill(store: SecretStore, tmp_path: Path) -> None:
    store.create_env("api", {"API_TOKEN": ENV_VALUE})
    store.create_s3("r2", "AKIDEXAMPLE", S3_SECRET, endpoint="https://r2.example", region="auto")
    (tmp_path / "key.pem").write_text(FILE_LINE + "\n")
    store.create_file("key", tmp_path / "key.pem", env_var="KEY_FILE")


def test_every_byte_at_rest_is_encrypted(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "home")
    fill(store, tmp_path)
    assert mode(store.home) == 0o700
    assert mode(store.home / "secret.key") == 0o600                      # made on first use
    for path in store.home.glob("store.db*"):                             # the store's table holds them
        assert mode(path) == 0o600, path
    on_disk = all_bytes(store.home)
    assert not [v for v in VALUES if v.encode() in on_disk]
    assert b"API_TOKEN" not in on_disk and b"AKIDEXAMPLE" not in on_disk   # names of variables too
    infos = {i.name: i for i in store.list()}
    assert infos["r2"].exposes == ["AWS_ACCESS_KEY_ID", "AWS_CONFIG_FILE -> config", "AWS_ENDPOINT_URL", "AWS_REGION",
                                   "AWS_SECRET_ACCESS_KEY", "AWS_SHARED_CREDENTIALS_FILE -> credentials",
                                   "S3_ENDPOINT_URL"]
    assert not [v for v in VALUES if v in repr(infos)]
    redact = store.redactor()
    assert redact(f"a {ENV_VALUE} b {S3_SECRET} c {FILE_LINE}") == "a **** b **** c ****"
    with pytest.raises(SecretError, match="exists"):
        store.create_env("api", {"X": "y"})
    with pytest.raises(SecretError, match="path traversal"):
        store.create_env("../evil", {"X": "y"})
    with pytest.raises(SecretError, match="set by Tessera"):
        store.create_env("bad", {"RUN_NAME": "x"})
    store.remove("key")
    with pytest.raises(SecretError, match="does not exist"):
        store.get("key")


def test_the_environment_key_wins_and_a_wrong_key_is_one_clear_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    env_key = Fernet.generate_key().decode()
    monkeypatch.setenv("TESSERA_SECRET_KEY_FILE", str(tmp_path / "team.key"))
    monkeypatch.setenv("TESSERA_SECRET_KEY", env_key)
    SecretStore(home).create_env("api", {"API_TOKEN": ENV_VALUE})
    assert not (tmp_path / "team.key").exists() and not (home / "secret.key").exists()   # the env key was used

    monkeypatch.delenv("TESSERA_SECRET_KEY")          # now the key file (made 0600) decides: not the same key
    with pytest.raises(SecretError) as caught:
        SecretStore(home).get("api")
    assert mode(tmp_path / "team.key") == 0o600
    message = str(caught.value)
    assert "secret 'api' cannot be decrypted with the configured key (TESSERA_SECRET_KEY_FILE=" in message
    key_file = (tmp_path / "team.key").read_text().strip()
    assert env_key not in message and key_file not in message

    result = CliRunner().invoke(app, ["secret", "list"], env={"TESSERA_HOME": str(home)})
    assert result.exit_code == 1 and result.output.startswith("error: secret 'api' cannot be decrypted")
    assert len(result.output.strip().splitlines()) == 1 and key_file not in result.output

    monkeypatch.setenv("TESSERA_SECRET_KEY", env_key)
    assert SecretStore(home).get("api").env() == {"API_TOKEN": ENV_VALUE}
    monkeypatch.setenv("TESSERA_SECRET_KEY", "not-a-key")
    with pytest.raises(SecretError, match="TESSERA_SECRET_KEY is not a Fernet key"):
        SecretStore(home).list()


def test_a_key_file_others_can_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = tmp_path / "open.key"
    key.write_bytes(Fernet.generate_key())
    key.chmod(0o644)
    monkeypatch.setenv("TESSERA_SECRET_KEY_FILE", str(key))
    with pytest.raises(SecretError, match=r"can be read by other users \(mode 644\); run `chmod 600"):
        SecretStore(tmp_path / "home").create_env("api", {"API_TOKEN": ENV_VALUE})


def test_a_key_another_process_just_made_is_kept(tmp_path: Path) -> None:
    """Two processes making the key at once: the second links nothing over the first, and uses it."""
    path = tmp_path / "home" / "secret.key"
    path.parent.mkdir()
    path.write_bytes(Fernet.generate_key())
    path.chmod(0o600)
    first = path.read_bytes()
    _create_key_file(path)                       # lost the race: the file appeared before its link
    assert path.read_bytes() == first and [p.name for p in path.parent.iterdir()] == ["secret.key"]
    store = SecretStore(tmp_path / "home")
    store.create_env("api", {"API_TOKEN": ENV_VALUE})
    with store.engine.connect() as c:
        assert Fernet(first).decrypt(c.execute(text("SELECT token FROM secrets WHERE name = 'api'")).scalar())


def test_plaintext_secrets_of_earlier_versions_are_encrypted_on_first_access(tmp_path: Path) -> None:
    """The layout the store wrote before encryption: NAME.json (0600) and files/NAME/FILENAME."""
    root = tmp_path / "home" / "secrets"
    (root / "files" / "key").mkdir(parents=True, mode=0o700)
    (root / "api.json").write_text(json.dumps({"type": "env", "name": "api", "created": 1.5,
                                               "values": {"API_TOKEN": ENV_VALUE}}))
    (root / "r2.json").write_text(json.dumps({"type": "s3", "name": "r2", "created": 2.5, "access_key_id": "AKID",
                                              "secret_access_key": S3_SECRET, "endpoint": None, "region": None}))
    (root / "key.json").write_text(json.dumps({"type": "file", "name": "key", "created": 3.5, "filename": "k.pem",
                                               "env_var": "KEY_FILE", "mount_path": None}))
    (root / "files" / "key" / "k.pem").write_text(FILE_LINE + "\n")
    store = SecretStore(tmp_path / "home")
    assert store.get("api").env() == {"API_TOKEN": ENV_VALUE}
    assert not root.exists()                      # imported into the store's table, encrypted, then removed
    assert not [v for v in VALUES if v.encode() in all_bytes(tmp_path / "home")]
    assert [(i.name, i.type, i.created) for i in store.list()] == [("api", "env", 1.5), ("key", "file", 3.5),
                                                                   ("r2", "s3", 2.5)]
    injection = store.injection(["key", "r2"], tmp_path / "res")
    assert injection.env["AWS_SECRET_ACCESS_KEY"] == S3_SECRET
    assert (tmp_path / "res" / "secrets" / "key" / "k.pem").read_text() == FILE_LINE + "\n"


def test_secrets_are_injected_and_never_shown(platform: Platform, tmp_path: Path) -> None:
    fill(platform.secrets, tmp_path)
    seen = tmp_path / "seen.json"
    command = (f"echo token=$API_TOKEN s3=$AWS_SECRET_ACCESS_KEY; cat $KEY_FILE; "
               f"{sys.executable} -c \"import json, os, stat; json.dump([os.environ['API_TOKEN'], "
               f"os.environ['AWS_SECRET_ACCESS_KEY'], open(os.environ['KEY_FILE']).read().strip(), "
               f"oct(stat.S_IMODE(os.stat(os.environ['KEY_FILE']).st_mode)), "
               f"open(os.environ['AWS_SHARED_CREDENTIALS_FILE']).read()], open('{seen}', 'w')); "
               f"raise SystemExit('failing with ' + os.environ['API_TOKEN'])\"")
    platform.create_run({"name": "leaky", "command": command, "secrets": ["api", "r2", "key"],
                         "scheduling": {"max_retries": 0}})
    run = platform.wait_for_run_status("leaky", ("FAILED", "COMPLETED"), timeout=30)
    token, s3_key, file_line, file_mode, credentials = json.loads(seen.read_text())
    assert (token, s3_key, file_line, file_mode) == (ENV_VALUE, S3_SECRET, FILE_LINE, "0o600")   # injected
    assert f"aws_secret_access_key = {S3_SECRET}" in credentials
    assert run.status == "FAILED"

    outputs = [CliRunner().invoke(app, args) for args in (["run", "describe", "leaky", "--json"],
                                                          ["run", "logs", "leaky"], ["secret", "list", "--json"])]
    logs = outputs[1].output
    assert "token=**** s3=****" in logs and "****" in logs.splitlines()[1], logs
    for value in VALUES:
        for out in outputs:
            assert value not in out.output
        assert value not in (platform.home / "supervisor.log").read_text()
    # what was decrypted for the run is gone once it ended: only the run's own log holds what it printed
    assert not list(platform.home.rglob("secrets.json")) and not list((platform.home / "runs").rglob("secrets"))
    leftover = b"".join(p.read_bytes() for p in platform.home.rglob("*") if p.is_file() and p.suffix != ".log")
    assert not [v for v in VALUES if v.encode() in leftover]


# --- the mask's forms: URL-encoded, base64, API keys (redaction.py) -----------------------------------

_VALUE = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=MIN_BASE64_LEN, max_size=24)
_BYTES = st.binary(max_size=6)


def _survivors(masked: str) -> int:
    return len(masked) - len(REDACTED) * masked.count(REDACTED)


@given(_VALUE, _BYTES, _BYTES)
def test_a_value_is_masked_url_encoded_and_inside_base64_text(value: str, before: bytes, after: bytes) -> None:
    """Inside base64 text, whatever its byte alignment and alphabet, what survives the mask is at most the
    characters that also carry the neighbouring bytes' bits (and padding): too few to hold the value."""
    redact = Redactor([value])
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        text = encode(before + value.encode() + after).decode()
        masked = redact(text)
        assert REDACTED in masked
        assert _survivors(masked) <= math.ceil(len(before) * 4 / 3) + math.ceil(len(after) * 4 / 3) + 4, masked
    lower_hex = re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quote(value, safe=""))
    for encoded in (quote(value, safe=""), quote_plus(value), lower_hex):
        masked = redact(f"?a=1&token={encoded}&b=2")
        assert encoded not in masked and value not in masked and REDACTED in masked


@given(st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-", min_size=43, max_size=43),
       _BYTES, _BYTES)
def test_api_keys_are_masked_by_their_prefix_in_every_form(body: str, before: bytes, after: bytes) -> None:
    key = "tsk_" + body
    redact = Redactor([])                     # not a stored secret: found by its prefix
    assert redact(f"Bearer {key}.") == "Bearer tsk_****."
    assert redact(f"api_key={key.replace('_', '%5F')}&x") == "api_key=tsk%5F****&x"
    assert redact(f"api_key={key.replace('_', '%5f').replace('-', '%2D')} x") == "api_key=tsk%5f**** x"
    masked = redact(base64.b64encode(before + f"Authorization: Bearer {key}".encode() + after).decode())
    assert masked.rstrip("=").endswith(REDACTED)       # from the key to the end of the text (but its padding)
    assert _survivors(masked) <= math.ceil((len(before) + 22) * 4 / 3) + 3


def test_metrics_rows_are_masked_as_log_lines_are() -> None:
    """Strings anywhere in a row (keys too); a number whose text is a secret; other numbers kept exactly."""
    redact = Redactor([ENV_VALUE, "31415926"])
    row = {"step": 3, "loss": 0.25, "note": f"token {ENV_VALUE}", ENV_VALUE: 1.5, "pin": 31415926,
           "nested": [{"url": quote(ENV_VALUE)}, 314159260, True, None]}
    assert redact.json(row) == {"step": 3, "loss": 0.25, "note": "token ****", "****": 1.5, "pin": "****",
                                "nested": [{"url": "****"}, 314159260, True, None]}


def test_a_file_name_too_long_for_a_file_is_refused_and_a_stored_one_fails_its_run_in_one_line(
        platform: Platform, tmp_path: Path) -> None:
    """A name is bounded when a secret is made; a record an earlier version took (300 bytes: no file system
    can write it) still lists, and the run that uses it FAILS saying why (it stayed PENDING forever)."""
    fields = {"env_var": "KEY_FILE", "content": b"file-secret-line-77e0f\n"}
    platform.secrets.create("file", "edge", filename="f" * MAX_FILENAME_BYTES, **fields)     # the bound itself
    for filename, size in (("f" * 300, 300), ("é" * 65, 130)):
        with pytest.raises(SecretInputError) as caught:
            platform.secrets.create("file", "long", filename=filename, **fields)
        assert str(caught.value) == (f"invalid file secret 'long': filename: file name {shorten(filename)!r} is "
                                     f"{size} bytes long; at most 128 are allowed (it is written as a file in the "
                                     "run's folder)")
    name = "a" * 300
    result = CliRunner().invoke(app, ["secret", "create", "env", name, "--from-env", "HOME"])
    assert result.exit_code == 2 and result.output == (
        f"error: invalid env secret '{'a' * 32}...': name: secret name '{'a' * 32}...' is 300 characters long; at "
        "most 63 are allowed\n")

    platform.secrets.add(FileSecret.model_validate({"name": "long", "filename": "f" * 300, **fields}))
    assert [i.name for i in platform.secrets.list()] == ["edge", "long"]
    platform.create_run({"name": "uses-long", "command": "true", "secrets": ["long"]})
    run = platform.wait_for_run_status("uses-long", ("FAILED", "COMPLETED"), timeout=30)
    assert (run.status, run.first_error) == ("FAILED", "cannot start on local: secret 'long': its file name (300 "
                                             "bytes) is too long to be written; create the secret again with a "
                                             "shorter one")
