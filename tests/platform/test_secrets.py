"""Secrets: typed, stored 0600 in a 0700 folder, injected as env or files, never shown."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.platform import Platform, SecretError
from tessera.platform.secrets import SecretStore

ENV_VALUE = "tok-8c1f2e9d7b"
S3_SECRET = "s3-secret-5a4b3c2d1e"
FILE_LINE = "file-secret-line-77e0f"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_store_modes_and_list_without_values(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "home")
    store.create_env("api", {"API_TOKEN": ENV_VALUE})
    store.create_s3("r2", "AKIDEXAMPLE", S3_SECRET, endpoint="https://r2.example", region="auto")
    (tmp_path / "key.pem").write_text(FILE_LINE + "\n")
    store.create_file("key", tmp_path / "key.pem", env_var="KEY_FILE")
    assert mode(store.root) == 0o700 and mode(store.home) == 0o700
    for path in store.root.rglob("*"):
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path
    infos = {i.name: i for i in store.list()}
    assert infos["r2"].exposes == ["AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_SECRET_ACCESS_KEY",
                                   "S3_ENDPOINT_URL"]
    assert ENV_VALUE not in repr(infos) and S3_SECRET not in repr(infos)
    injection = store.injection(["api", "r2", "key"])
    assert injection.env["API_TOKEN"] == ENV_VALUE and injection.env["AWS_SECRET_ACCESS_KEY"] == S3_SECRET
    assert injection.env["S3_ENDPOINT_URL"] == "https://r2.example"
    [(path, mount, var)] = injection.files
    assert var == "KEY_FILE" and path.read_text().strip() == FILE_LINE and mount.endswith("/key/key.pem")
    redact = store.redactor()
    assert redact(f"a {ENV_VALUE} b {S3_SECRET} c {FILE_LINE}") == "a **** b **** c ****"
    with pytest.raises(SecretError, match="exists"):
        store.create_env("api", {"X": "y"})
    with pytest.raises(SecretError, match="path traversal"):
        store.create_env("../evil", {"X": "y"})
    with pytest.raises(SecretError, match="set by Tessera"):
        store.create_env("bad", {"RUN_NAME": "x"})
    store.remove("key")
    assert not (store.root / "files" / "key").exists()
    with pytest.raises(SecretError, match="does not exist"):
        store.get("key")


def test_secrets_are_injected_and_never_shown(platform: Platform, tmp_path: Path) -> None:
    platform.secrets.create_env("api", {"API_TOKEN": ENV_VALUE})
    platform.secrets.create_s3("r2", "AKIDEXAMPLE", S3_SECRET)
    (tmp_path / "key.pem").write_text(FILE_LINE + "\n")
    platform.secrets.create_file("key", tmp_path / "key.pem", env_var="KEY_FILE")
    seen = tmp_path / "seen.json"
    command = (f"echo token=$API_TOKEN s3=$AWS_SECRET_ACCESS_KEY; cat $KEY_FILE; "
               f"{sys.executable} -c \"import json, os; json.dump([os.environ['API_TOKEN'], "
               f"os.environ['AWS_SECRET_ACCESS_KEY'], open(os.environ['KEY_FILE']).read().strip()], "
               f"open('{seen}', 'w')); raise SystemExit('failing with ' + os.environ['API_TOKEN'])\"")
    platform.create_run({"name": "leaky", "command": command, "secrets": ["api", "r2", "key"],
                         "scheduling": {"max_retries": 0}})
    run = platform.wait_for_run_status("leaky", ("FAILED", "COMPLETED"), timeout=30)
    assert json.loads(seen.read_text()) == [ENV_VALUE, S3_SECRET, FILE_LINE]    # injected
    assert run.status == "FAILED"

    cli = [sys.executable, "-m", "tessera.cli.main"]
    outputs = [subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60)
               for args in (["run", "describe", "leaky"], ["run", "describe", "leaky", "--json"],
                            ["run", "logs", "leaky"], ["secret", "list"], ["secret", "list", "--json"],
                            ["run", "list", "--json"])]
    logs = outputs[2].stdout
    assert "token=**** s3=****" in logs and "****" in logs.splitlines()[1], logs
    db_bytes = b"".join(p.read_bytes() for p in platform.home.glob("state.db*"))
    assert b"API_TOKEN" in db_bytes or b"api" in db_bytes          # the db is readable here...
    for value in (ENV_VALUE, S3_SECRET, FILE_LINE):                # ...and holds no secret value
        for out in outputs:
            assert value not in out.stdout + out.stderr
        assert value.encode() not in db_bytes
        assert value not in (platform.home / "supervisor.log").read_text()
    assert not list(platform.home.rglob("secrets.json"))            # nothing materialised is left
