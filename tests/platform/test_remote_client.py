"""The CLI and the SDK against a real `tessera server start` (tests/server/conftest.py's fixture): the same
verbs and the same output as on this machine, `tessera login`, and refused keys or an unreachable server
as one line, never a traceback."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from server.conftest import LiveServer, server  # noqa: F401  (the module-scoped server fixture)
from typer.testing import CliRunner, Result

from tessera.cli import cluster as cli_cluster
from tessera.cli import run as cli_run
from tessera.cli import secret as cli_secret
from tessera.cli.main import app
from tessera.platform import Platform, RunNotFound, SecretError
from tessera.platform.api.client import RemotePlatform
from tessera.platform.api.connection import connect as real_connect
from tessera.platform.api.transport import MAX_LINE, sse_data, text_lines
from tessera.platform.clusters.local import free_port
from tessera.platform.server.settings import ServerSettings
from tessera.platform.server.teams import TeamPlatforms
from tessera.platform.store.db import make_engine

runner = CliRunner()
STOPPED = ("STOPPED", "COMPLETED", "FAILED")


@pytest.fixture
def client_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's own TESSERA_HOME (where `tessera login` saves), with no server named in the environment."""
    for name in ("TESSERA_API_URL", "TESSERA_API_KEY", "TESSERA_SECRET_KEY", "TESSERA_SECRET_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path / "client-home"))
    return tmp_path / "client-home"


def remote(live: LiveServer, user: str = "alice", key: str | None = None) -> dict[str, str]:
    return {"TESSERA_API_URL": live.url, "TESSERA_API_KEY": key or live.keys[user]}


def local(live: LiveServer, team: str = "red") -> dict[str, str]:
    """No server named: the CLI's platform is the in-process one (`team_view` makes it the team's view of
    the server's store, what the server itself reads)."""
    return {"TESSERA_HOME": str(live.home / "teams" / team), "TESSERA_API_URL": "",
            "TESSERA_SECRET_KEY_FILE": str(live.home / "secret.key")}


def team_platform(live: LiveServer, team: str = "red") -> Platform:
    """The in-process Platform of the team on the server's store and artifacts, as the server opens it."""
    settings = ServerSettings.resolve(home=live.home)
    return TeamPlatforms(make_engine(settings.db_url), live.home, artifacts_url=settings.artifacts_url).open(team)


@pytest.fixture
def team_view(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The CLI's `connect()` without a server named gives team red's view of the server's store (a
    standalone CLI's own store is another one since the platform has one store)."""
    def connect() -> Platform | RemotePlatform:
        return real_connect() if os.environ.get("TESSERA_API_URL") else team_platform(server)
    for module in (cli_run, cli_cluster, cli_secret):
        monkeypatch.setattr(module, "connect", connect)


def tessera(*args: str, env: dict[str, str] | None = None, code: int = 0, stdin: str | None = None) -> Result:
    result = runner.invoke(app, list(args), env=env, input=stdin)
    assert result.exit_code == code, (result.output, result.exception)
    return result


def error_line(result: Result) -> str:
    """The one line a failed command prints; no traceback."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return lines[0]


@pytest.fixture
def sdk(server: LiveServer) -> Iterator[RemotePlatform]:  # noqa: F811
    platform = RemotePlatform(server.url, server.keys["alice"])
    yield platform
    platform.close()


def test_submit_follow_and_output_as_on_this_machine(server: LiveServer, client_home: Path,  # noqa: F811
                                                     tmp_path: Path, team_view: None) -> None:
    spec = tmp_path / "mcli.yaml"   # MCLI's run YAML: the client reads it as the local platform does
    spec.write_text("run_name: remote-hello\ngpu_num: 0\ncluster: local\n"
                    "command: |\n  echo hello from $RUN_NAME\n  echo step 2\n")
    done = tessera("run", "submit", "-f", str(spec), "--follow", env=remote(server))
    assert done.stdout.splitlines() == ["hello from remote-hello", "step 2"]
    assert "run remote-hello: COMPLETED" in done.stderr
    listed = tessera("run", "list", "--json", "--user", "alice", env=remote(server)).stdout
    assert json.loads(listed.splitlines()[0])["user"] == "alice"
    for verb in (["run", "list"], ["run", "list", "--json"], ["run", "describe", "remote-hello"],
                 ["run", "logs", "remote-hello"], ["cluster", "list", "--json"], ["cluster", "describe", "local"]):
        assert tessera(*verb, env=remote(server)).output == tessera(*verb, env=local(server)).output, verb
    assert tessera("run", "describe", "remote-hello", env=remote(server, "bob"), code=1).output.startswith(
        "error: no run named 'remote-hello'")


def test_lifecycle_verbs_through_the_server(server: LiveServer, client_home: Path,  # noqa: F811
                                            sdk: RemotePlatform) -> None:
    env = remote(server)
    sdk.create_run({"name": "sleeper", "command": "echo started; sleep 30", "scheduling": {"stop_grace": "5s"}})
    sdk.wait_for_run_status("sleeper", "RUNNING", timeout=30)
    tessera("run", "update", "sleeper", "--priority", "high", "--max-retries", "1", env=env)
    scheduling = json.loads(tessera("run", "describe", "sleeper", "--json", env=env).stdout)["spec"]["scheduling"]
    assert (scheduling["priority"], scheduling["max_retries"]) == ("high", 1)
    assert "priority" in error_line(tessera("run", "update", "sleeper", "--priority", "urgent", env=env, code=1))
    tessera("run", "clone", "sleeper", "--name", "sleeper-2", env=env)
    clone = sdk.get_run("sleeper-2")
    assert (clone.user, clone.spec.command, clone.spec.scheduling.priority) == ("alice", "echo started; sleep 30", "high")
    assert "STOPPED" in tessera("run", "stop", "sleeper", "--wait", env=env).stderr
    for name in ("sleeper", "sleeper-2"):
        tessera("run", "delete", name, "--yes", env=env)
    assert sdk.count_runs(q="sleeper") == 0
    assert "no run named 'sleeper'" in error_line(tessera("run", "describe", "sleeper", env=env, code=1))
    assert sdk.list_runs(q="sleeper") == []


def test_login_saves_a_private_key_file_and_bad_keys_fail_in_one_line(server: LiveServer,  # noqa: F811
                                                                      client_home: Path) -> None:
    wrong = tessera("login", server.url, stdin="tsk_" + "x" * 43 + "\n", code=1)
    assert "not authorised" in error_line(wrong) and "tessera login" in error_line(wrong)
    assert not (client_home / "credentials.json").exists()
    assert "logged in" in tessera("login", server.url + "/", stdin=server.keys["alice"] + "\n").stderr
    saved = client_home / "credentials.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert json.loads(saved.read_text()) == {"url": server.url, "api_key": server.keys["alice"]}
    through_login = tessera("run", "list", "--json").stdout   # alice's team's runs, not this home's
    assert through_login == tessera("run", "list", "--json", env=remote(server)).stdout
    assert not (client_home / "state.db").exists()
    refused = tessera("run", "list", env={"TESSERA_API_KEY": "tsk_wrong", "TESSERA_API_URL": server.url}, code=1)
    assert "not authorised" in error_line(refused)
    tessera("logout")
    assert not saved.exists()
    dead = f"http://127.0.0.1:{free_port()}"
    assert dead in error_line(tessera("run", "list", env={"TESSERA_API_URL": dead}, code=1))
    assert tessera("login", "ftp://example.com", stdin="k\n", code=2).output.startswith("error:")


def test_sdk_returns_what_the_local_platform_returns(server: LiveServer, sdk: RemotePlatform,  # noqa: F811
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     team_view: None) -> None:
    run = sdk.create_run("name: sdk-run\ncommand: echo one; echo two\n")
    assert run.user == "alice"
    sdk.wait_for_run_status("sdk-run", "COMPLETED", timeout=30)
    assert list(sdk.follow_logs("sdk-run")) == ["one", "two"]
    assert list(sdk.follow_logs("sdk-run", follow=False)) == ["one", "two"]
    monkeypatch.setenv("TESSERA_SECRET_KEY_FILE", str(server.home / "secret.key"))
    mine = team_platform(server)
    try:
        assert sdk.get_run("sdk-run") == mine.get_run("sdk-run")
        assert sdk.describe_run("sdk-run") == mine.describe_run("sdk-run")
        assert sdk.count_runs() == mine.count_runs()
    finally:
        mine.close()
    assert sdk.run_metrics("sdk-run") == ([], 0)
    with pytest.raises(RunNotFound):
        sdk.get_run("../../etc")
    tessera("cluster", "add", "box2", "--type", "local", env=remote(server))
    rows = {row["name"]: row for row in map(json.loads, tessera("cluster", "list", "--json", env=remote(server))
                                            .stdout.splitlines())}
    assert (rows["box2"]["provider"], rows["box2"]["nodes"]) == ("local", 1)
    tessera("cluster", "remove", "box2", env=remote(server))
    assert "box2" in error_line(tessera("cluster", "describe", "box2", env=remote(server), code=1))
    key = tmp_path / "id_key"
    key.write_bytes(b"-----BEGIN KEY-----\nabc\n")
    sdk.secrets.create_env("tok", {"TOKEN": "value-never-returned"})
    sdk.secrets.create_file("keyfile", key)
    listed = {info.name: info.type for info in sdk.secrets.list()}
    assert listed == {"tok": "env", "keyfile": "file"}
    assert "value-never-returned" not in repr(sdk.secrets.list())
    secrets_listed = tessera("secret", "list", "--json", env=remote(server)).output
    assert secrets_listed == tessera("secret", "list", "--json", env=local(server)).output
    assert "keyfile" in secrets_listed and "value-never-returned" not in secrets_listed
    key.write_bytes(b"x" * (64 * 1024 + 1))
    with pytest.raises(SecretError, match="64 KiB"):
        sdk.secrets.create_file("big", key)
    for name in ("tok", "keyfile"):
        sdk.secrets.remove(name)
    with pytest.raises(SecretError):
        sdk.secrets.remove("tok")


def test_server_sent_events_and_long_lines() -> None:
    stream = ["data: one", "", ": keep-alive", "", "data:two", "data: three", "", "event: end", "data: COMPLETED",
              "", "data: after the end"]
    assert list(sse_data(stream)) == ["one", "two\nthree"]
    chunks = [b"a\nb", b"c\n", b"x" * (MAX_LINE + 10), b"y\nlast"]
    assert [line[:3] for line in text_lines(chunks)] == ["a", "bc", "xxx", "las"]
    assert [len(line) for line in text_lines(chunks)][2] == MAX_LINE
