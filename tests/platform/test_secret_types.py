"""MCLI's secret types: each is injected the way MCLI injects it (variables, files 0600 in the resumption
folder), redacted from logs, validated in one line, and created from stdin or files by the CLI."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.platform.secrets.vault import SecretInputError, SecretStore

KEY = Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
KEY_LINE = KEY.decode().splitlines()[1]
LOCKED_KEY = Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.PKCS8,
                                                        BestAvailableEncryption(b"passphrase"))
GCP = json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "gcp-key-id-91c2e",
                  "private_key": "-----BEGIN PRIVATE KEY-----\nGCPKEYBODY0123456789\n-----END PRIVATE KEY-----\n"})
AWS_CREDENTIALS = b"[default]\naws_access_key_id = AKIDFROMFILE\naws_secret_access_key = s3-file-secret-7d1e\n"
AWS_CONFIG = b"[default]\nregion = eu-west-1\n"


def isolated_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    """TESSERA_HOME at `home`, with no secret key and no server taken from the outer environment."""
    for var in ("TESSERA_SECRET_KEY", "TESSERA_SECRET_KEY_FILE", "TESSERA_API_URL", "TESSERA_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TESSERA_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return isolated_home(monkeypatch, tmp_path / "home")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# (type, fields, expected env, {env var naming a file: expected content}, values the Redactor must hide)
CASES = [
    ("s3", {"credentials": AWS_CREDENTIALS, "config": AWS_CONFIG, "endpoint": "https://r2.example"},
     {"AWS_ACCESS_KEY_ID": "AKIDFROMFILE", "AWS_SECRET_ACCESS_KEY": "s3-file-secret-7d1e",
      "S3_ENDPOINT_URL": "https://r2.example"},
     {"AWS_SHARED_CREDENTIALS_FILE": AWS_CREDENTIALS, "AWS_CONFIG_FILE": AWS_CONFIG}, ["s3-file-secret-7d1e"]),
    ("env", {"values": {"WANDB_API_KEY": "wandb-5f0a9c"}}, {"WANDB_API_KEY": "wandb-5f0a9c"}, {}, ["wandb-5f0a9c"]),
    ("mounted", {"content": b"mounted-value-33b1"}, {}, {"SECRET_PATH_CREDS": b"mounted-value-33b1"},
     ["mounted-value-33b1"]),
    ("ssh", {"content": KEY}, {}, {"SECRET_PATH_CREDS": KEY}, [KEY_LINE]),
    ("git-ssh", {"content": KEY},
     {"GIT_SSH_COMMAND": 'ssh -i "$SECRET_PATH_CREDS" -o IdentitiesOnly=yes -o StrictHostKeyChecking=accept-new'},
     {"SECRET_PATH_CREDS": KEY}, [KEY_LINE]),
    ("gcp", {"content": GCP.encode()}, {}, {"GOOGLE_APPLICATION_CREDENTIALS": GCP.encode()},
     ["gcp-key-id-91c2e", "GCPKEYBODY0123456789"]),
    ("azure", {"account_name": "acct42", "account_key": "azure-key-0c9d=="},
     {"AZURE_ACCOUNT_NAME": "acct42", "AZURE_ACCOUNT_ACCESS_KEY": "azure-key-0c9d=="}, {}, ["azure-key-0c9d=="]),
]


@pytest.mark.parametrize(("type_", "fields", "env", "files", "hidden"), CASES, ids=[c[0] for c in CASES])
def test_each_type_is_injected_as_mcli_does(tmp_path: Path, type_: str, fields: dict, env: dict, files: dict,
                                            hidden: list[str]) -> None:
    store = SecretStore()
    store.create(type_, "creds", **fields)
    folder = tmp_path / "run" / "0"          # a resumption folder, as the supervisor passes it
    injection = store.injection(["creds"], folder)
    assert env.items() <= injection.env.items()
    assert {var: path.read_bytes() for path, _, var in injection.files} == files
    for path, mount, _ in injection.files:
        assert path.parent == folder / "secrets" / "creds" and mode(path) == 0o600
        assert mode(path.parent) == 0o700 and mode(folder / "secrets") == 0o700
        assert mount.startswith("/secrets/creds/")
    redact = store.redactor()
    assert all(redact(f"log {value} end") == "log **** end" for value in hidden)


def test_docker_registry_writes_a_docker_config(tmp_path: Path) -> None:
    store = SecretStore()
    store.create("docker-registry", "reg", username="bob", password="registry-token-8e2f",
                 server="https://registry.example:5000")
    injection = store.injection(["reg"], tmp_path / "res")
    [(path, mount, var)] = injection.files
    assert var == "REGISTRY_AUTH_FILE" and path.name == "config.json" and mount == "/secrets/reg/config.json"
    assert injection.env["DOCKER_CONFIG"] == str(path.parent)
    entry = json.loads(path.read_text())["auths"]["https://registry.example:5000"]
    assert base64.b64decode(entry["auth"]).decode() == "bob:registry-token-8e2f"
    assert store.redactor()(f"{entry['auth']} registry-token-8e2f") == "**** ****"


def test_git_uses_the_git_ssh_key(tmp_path: Path) -> None:
    """Real git runs GIT_SSH_COMMAND through its shell: the key's variable expands to the written key."""
    store = SecretStore()
    store.create("git-ssh", "deploy-key", content=KEY)
    injection = store.injection(["deploy-key"], tmp_path / "res")
    [(key_path, _, var)] = injection.files
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SSH_ARGS"\nexit 1\n')
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, **injection.env, var: str(key_path), "SSH_ARGS": str(tmp_path / "args"),
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "GIT_TERMINAL_PROMPT": "0"}
    subprocess.run(["git", "ls-remote", "ssh://git@example.invalid/repo.git"], env=env, capture_output=True,
                   timeout=30)
    args = (tmp_path / "args").read_text().splitlines()
    assert args[args.index("-i") + 1] == str(key_path)
    assert "IdentitiesOnly=yes" in args and "StrictHostKeyChecking=accept-new" in args


@pytest.mark.parametrize(("type_", "fields", "expected"), [
    ("ssh", {"content": LOCKED_KEY}, "has a passphrase"),
    ("git-ssh", {"content": b"not a key at all"}, "not an SSH private key"),
    ("gcp", {"content": b"{not json"}, "not JSON"),
    ("gcp", {"content": b'{"project_id": "p"}'}, 'no "type"'),
    ("azure", {"account_name": "Bad_Name", "account_key": "k"}, "account_name"),
    ("mounted", {"content": b"x" * (64 * 1024 + 1)}, "content"),
    ("mounted", {"content": b"x", "mount_path": "relative/dir"}, "absolute path"),
    ("s3", {"credentials": b"[a]\naws_access_key_id = A\n[b]\n"}, "no [default] profile (profiles: a, b)"),
    ("docker-registry", {"username": "u"}, "password"),
    ("kerberos", {}, "unknown secret type"),
])
def test_bad_input_is_one_line_naming_the_field(type_: str, fields: dict, expected: str) -> None:
    with pytest.raises(SecretInputError) as caught:
        SecretStore().create(type_, "creds", **fields)
    message = str(caught.value)
    assert expected in message and "\n" not in message, message
    assert SecretStore().list() == []


def cli(*args: str, stdin: str | bytes | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["secret", *args], input=stdin)
    return result.exit_code, result.output


def test_cli_creates_lists_and_removes_every_type_from_stdin(tmp_path: Path, home: Path) -> None:
    (tmp_path / "credentials").write_bytes(AWS_CREDENTIALS)
    (tmp_path / "id_key").write_bytes(KEY)
    commands = [
        (["s3", "s3c", "--credentials-file", str(tmp_path / "credentials")], None),
        (["s3", "s3k", "--access-key-id", "AKIDSTDIN", "--stdin", "--region", "auto"], "s3-stdin-secret-4b\n"),
        (["env", "envc", "--stdin"], "API_TOKEN=env-stdin-value-1\n"),
        (["file", "filec", str(tmp_path / "id_key"), "--env-var", "KEY_FILE"], None),
        (["mounted", "mnt", "--stdin"], "mounted-stdin-value-2"),
        (["ssh", "sshc", "--stdin"], KEY.decode()),
        (["git-ssh", "gitc", str(tmp_path / "id_key")], None),
        (["gcp", "gcpc", "--stdin"], GCP),
        (["docker-registry", "regc", "--username", "bob", "--password-stdin"], "docker-stdin-pass-3\n"),
        (["docker", "regd", "--username", "bob", "--stdin"], "docker-stdin-pass-4\n"),
        (["azure", "azc", "--account-name", "acct42", "--stdin"], "azure-stdin-key-5\n"),
    ]
    for args, stdin in commands:
        code, output = cli("create", *args, stdin=stdin)
        assert code == 0 and f"created secret {args[1]}" in output, output
    code, listing = cli("list", "--json")
    rows = [json.loads(line) for line in listing.splitlines()]
    assert code == 0 and [(r["name"], r["type"]) for r in rows] == sorted(
        (args[1], args[0].replace("docker", "docker-registry") if args[0] == "docker" else args[0])
        for args, _ in commands)
    secrets = ["s3-stdin-secret-4b", "env-stdin-value-1", "mounted-stdin-value-2", "docker-stdin-pass-3",
               "azure-stdin-key-5", KEY_LINE, "GCPKEYBODY", "s3-file-secret-7d1e"]
    _, table = cli("list")
    for value in secrets:
        assert value not in listing + table
    on_disk = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
    assert not [v for v in secrets if v.encode() in on_disk]
    store = SecretStore()
    assert store.get("s3k").env()["AWS_SECRET_ACCESS_KEY"] == "s3-stdin-secret-4b"     # one newline dropped
    assert store.get("regc").password == "docker-stdin-pass-3"
    for args, _ in commands:
        assert cli("remove", args[1])[0] == 0
    assert cli("list", "--json") == (0, "")


@pytest.mark.parametrize(("args", "stdin", "expected"), [
    (["mounted", "m"], None, "give the value as a file path or with --stdin"),
    (["ssh", "k", "--stdin"], "junk", "not an SSH private key"),
    (["git-ssh", "k", "/nonexistent/id_rsa"], None, "cannot read the SSH private key file /nonexistent/id_rsa"),
    (["azure", "a", "--account-name", "acct42"], None, "give the account access key with"),
    (["azure", "a", "--account-name", "acct42", "--from-env", "NOT_SET_ANYWHERE_X"], None, "is not set here"),
    (["docker-registry", "d", "--username", "u", "--stdin", "--password-file", "/x"], "p", "one way"),
    (["docker-registry", "d", "--username", "u", "--stdin"], "\n", "is empty"),
    (["gcp", "../up", "--stdin"], GCP, "path traversal"),
    (["s3", "s", "--stdin"], "secret\n", "give --access-key-id"),
])
def test_cli_bad_input_exits_2_with_one_line(args: list[str], stdin: str | None, expected: str) -> None:
    code, output = cli("create", *args, stdin=stdin)
    assert code == 2 and output.startswith("error:") and expected in output, output
    assert len(output.strip().splitlines()) == 1 and "Traceback" not in output
