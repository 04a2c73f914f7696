"""A real control-plane server for each test module: `tessera server start` as a subprocess on a free
127.0.0.1 port with its own home, users alice (team red) and bob (team blue) made by the admin CLI, and
the platform's fast supervisor settings (as tests/platform/conftest.py) in its environment.

The commands run as `python -m tessera.cli.server ...`: the same typer app `tessera server` is, without
importing every other command group (torch comes with `tessera train`, seconds on a busy machine);
tests/server/test_console.py starts it through `tessera.cli.main`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from tessera.platform.clusters.local import free_port
from tessera.platform.store.db import make_engine, sqlite_url
from tessera.platform.supervision.supervisor import stop_supervisor

START_TIMEOUT = 30.0


SERVER_CLI = [sys.executable, "-m", "tessera.cli.server"]


def server_env(folder: Path) -> dict[str, str]:
    env = {**os.environ, "TESSERA_HOME": str(folder / "tessera-home"), "TESSERA_SUPERVISOR_POLL": "0.2",
           "TESSERA_SUPERVISOR_IDLE": "30", "TESSERA_RETRY_BACKOFF": "0"}
    for name in ("TESSERA_API_URL", "TESSERA_API_KEY", "TESSERA_DB_URL", "TESSERA_SECRET_KEY",
                 "TESSERA_SECRET_KEY_FILE"):
        env.pop(name, None)
    return env


@dataclass
class LiveServer:
    url: str
    home: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    log: Path
    keys: dict[str, str] = field(default_factory=dict)

    def client(self, user: str | None = None, connections: int = 10) -> httpx.Client:
        """An HTTP client on /api/v1/, with `user`'s key (none without a user)."""
        headers = {"Authorization": f"Bearer {self.keys[user]}"} if user else {}
        return httpx.Client(base_url=f"{self.url}/api/v1/", headers=headers, timeout=30,
                            limits=httpx.Limits(max_connections=connections))

    def wait_done(self, user: str, name: str, timeout: float = 30.0) -> dict[str, object]:
        """The run once it has ended (COMPLETED, FAILED or STOPPED)."""
        deadline = time.monotonic() + timeout
        with self.client(user) as api:
            while True:
                run = api.get(f"runs/{name}").raise_for_status().json()
                if run["status"] in ("COMPLETED", "FAILED", "STOPPED"):
                    return run
                if time.monotonic() > deadline:
                    raise AssertionError(f"run {name} is {run['status']} after {timeout} s; server log:\n"
                                         f"{self.log.read_text()[-3000:]}")
                time.sleep(0.1)


def start_server(folder: Path, home: Path, env: dict[str, str],
                 args: Sequence[str] = ()) -> tuple[str, subprocess.Popen[bytes], Path]:
    """Start `tessera server start` and wait until /api/v1/health answers. `args` go after the defaults
    (`--artifacts`, `--lease-seconds`; a second `--log-level` wins over this one)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = folder / f"server-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([*SERVER_CLI, "start", "--port", str(port), "--log-level", "info",
                                    "--home", str(home), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                return url, process, log
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            raise AssertionError(f"the server did not start (exit {process.returncode}):\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def stop_server(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[object]:
    """One throwaway PostgreSQL server (scripts/postgres-up.sh) for the session; each module that needs
    one makes its own database on it (server_proc.fresh_database). Skipped where PostgreSQL cannot be
    started, except in CI (CI=true), where that is a failure."""
    from server_proc import start_postgres

    try:
        cluster = start_postgres()
    except RuntimeError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"PostgreSQL is required in CI: {exc}")
        pytest.skip(f"PostgreSQL cannot be started on this machine: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on an empty store database (not migrated): a SQLite file, or a new database of its own on
    the session's PostgreSQL."""
    from server_proc import fresh_database

    if request.param == "sqlite":
        engine = make_engine(sqlite_url(tmp_path / "store.db"))
    else:
        cluster = request.getfixturevalue("postgres_cluster")
        engine = make_engine(fresh_database(cluster, f"fe_{request.node.originalname[-30:]}").url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("server")
    home = folder / "server-home"
    env = server_env(folder)
    url, process, log = start_server(folder, home, env)
    live = LiveServer(url, home, env, process, log)
    try:
        made = {user: subprocess.Popen([*SERVER_CLI, "admin", "create-user", user, "--team", team, "--home", str(home)], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=env)
                for user, team in (("alice", "red"), ("bob", "blue"))}
        for user, proc in made.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            live.keys[user] = out.strip()
        yield live
    finally:
        stop_server(process)
        for team_home in (home / "teams").glob("*"):
            stop_supervisor(team_home)
