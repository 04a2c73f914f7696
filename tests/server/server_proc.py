"""A real `tessera server start` subprocess on any database, and a throwaway PostgreSQL to give it, for
tests/server/test_postgres_server.py, test_load.py and the server benchmarks (server_api.py, and the
replicas of server_scale.py, server_takeover.py and server_replicas_logs.py).

conftest.py's `server` fixture is one server on SQLite per module; these need a server started again on
the same home and database (persistence), another database, and the same thing outside pytest (the
benchmark), so they drive conftest's start/stop functions through this class.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import httpx

from tessera.platform.clusters.local import free_port
from tessera.platform.supervision.supervisor import stop_supervisor

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
TERMINAL = ("COMPLETED", "FAILED", "STOPPED")


def _server_conftest() -> ModuleType:
    """tests/server/conftest.py as a plain module, for its server_env, start_server and stop_server (one
    copy of them): a benchmark has no pytest to import it, and under pytest its name `conftest` is shared
    by every folder's."""
    name = "tessera_server_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("conftest.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module   # before running it: its dataclass looks its module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


_conftest = _server_conftest()
SERVER_CLI: list[str] = _conftest.SERVER_CLI
server_env: Callable[[Path], dict[str, str]] = _conftest.server_env


@dataclass
class ServerProcess:
    """One `tessera server start`; `keys` maps user names to their API keys."""
    folder: Path
    home: Path
    env: dict[str, str]
    db: str | None = None
    url: str = ""
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    keys: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)   # more of `server start`'s options (conftest.start_server)

    def _db_args(self) -> list[str]:
        return ["--home", str(self.home), *(["--db", self.db] if self.db else [])]

    def start(self) -> None:
        """Start the server on a free port and wait until /api/v1/health answers. The database is given
        as $TESSERA_DB_URL (the admin commands pass the same URL as --db: both ways must agree)."""
        env = {**self.env, **({"TESSERA_DB_URL": self.db} if self.db else {})}
        self.url, self.process, self.log = _conftest.start_server(self.folder, self.home, env, self.args)

    def stop(self) -> None:
        """SIGTERM to the server's process group (uvicorn shuts down cleanly), SIGKILL after 10 s."""
        if self.process is not None:
            _conftest.stop_server(self.process)

    def admin(self, *args: str) -> subprocess.Popen[str]:
        """`tessera server admin ARGS` on this server's home and database, started (add_users waits)."""
        return subprocess.Popen([*SERVER_CLI, "admin", *args, *self._db_args()], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)

    def add_users(self, users: dict[str, str]) -> None:
        """Create each user (name -> team) and keep the key the admin CLI prints once. The first user of
        each team is made before the others (creating one new team from two processes at once is not
        supported); each wave's commands run at once."""
        firsts = {team: user for user, team in reversed(users.items())}
        for wave in (set(firsts.values()), set(users) - set(firsts.values())):
            made = {user: self.admin("create-user", user, "--team", users[user]) for user in sorted(wave)}
            for user, process in made.items():
                out, err = process.communicate(timeout=120)
                if process.returncode != 0:
                    raise RuntimeError(f"tessera server admin create-user {user} failed: {err.strip()[-2000:]}")
                self.keys[user] = out.strip()

    def client(self, user: str | None = None, timeout: float = 60) -> httpx.Client:
        """An HTTP client on /api/v1/ with `user`'s key (none without a user)."""
        headers = {"Authorization": f"Bearer {self.keys[user]}"} if user else {}
        return httpx.Client(base_url=f"{self.url}/api/v1/", headers=headers, timeout=timeout)

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log and self.log.exists() else ""


@contextmanager
def served(folder: Path, users: dict[str, str]) -> Iterator[ServerProcess]:
    """A started server (SQLite, home in `folder`) with `users` (name -> team); stopped afterwards, with
    the team supervisors it started."""
    server = ServerProcess(folder, folder / "server-home", server_env(folder))
    server.start()
    try:
        server.add_users(users)
        yield server
    finally:
        server.stop()
        for team_home in (server.home / "teams").glob("*"):
            stop_supervisor(team_home)


def wait_all_done(server: ServerProcess, user: str, total: int, timeout: float) -> list[dict[str, object]]:
    """`user`'s runs once none of the `total` listed is active any more (one list request per poll, not
    one request per run)."""
    deadline = time.monotonic() + timeout
    with server.client(user) as api:
        while True:
            page = api.get("runs", params={"user": user, "limit": total + 50}).raise_for_status().json()
            runs = page["items"]
            if len(runs) >= total and all(r["status"] in TERMINAL for r in runs):
                return runs
            if time.monotonic() > deadline:
                waiting = [f"{r['name']}={r['status']}" for r in runs if r["status"] not in TERMINAL]
                raise TimeoutError(f"{user}: {len(runs)}/{total} runs listed after {timeout} s, still active: "
                                   f"{waiting[:10]}; server log:\n{server.tail()}")
            time.sleep(0.25)


@dataclass
class Postgres:
    """A throwaway PostgreSQL cluster made by scripts/postgres-up.sh in `folder`."""
    folder: Path
    url: str

    def stop(self) -> None:
        subprocess.run([str(SCRIPTS / "postgres-down.sh"), str(self.folder)], capture_output=True, timeout=60)


def fresh_database(cluster: Postgres, name: str) -> Postgres:
    """A new, empty database `name` on `cluster` (dropped first if a earlier run left it): modules of one
    session share one PostgreSQL server, each with a database of its own. Stopping it stops the cluster:
    leave that to the cluster's owner."""
    import psycopg

    admin = cluster.url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        db.execute(f"CREATE DATABASE {name}")
    return Postgres(cluster.folder, cluster.url.rsplit("/", 1)[0] + f"/{name}")


def start_postgres() -> Postgres:
    """scripts/postgres-up.sh in a new folder straight under the temp folder (the `postgres` user, which
    runs it when we are root, must reach it: pytest's temp folders are 0700). RuntimeError saying why
    when PostgreSQL cannot be started here."""
    folder = Path(tempfile.mkdtemp(prefix="tessera-pg-"))
    done = subprocess.run([str(SCRIPTS / "postgres-up.sh"), str(folder), str(free_port())], capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/postgres-up.sh exited {done.returncode}: {done.stderr.strip()[-1000:]}")
    return Postgres(folder, done.stdout.strip().splitlines()[-1])


@dataclass
class Load:
    """What `submit_load` did: the run names each user submitted, every answer's status code (and the
    text of the unexpected ones), and how long submitting took."""
    names: dict[str, list[str]]
    codes: list[int]
    errors: list[str]
    seconds: float


def load_spec(user: str, i: int, fail_every: int) -> dict[str, str]:
    """The i-th run of `user`: prints a line, or (every `fail_every`-th) fails with exit status 3."""
    name = f"load-{user}-{i:03d}"
    failing = fail_every > 0 and i % fail_every == fail_every - 1
    return {"name": name, "command": f"echo {name} fails; exit 3" if failing else f"echo {name} ok"}


def submit_load(server: ServerProcess, users: list[str], total: int, threads: int = 8,
                fail_every: int = 10) -> Load:
    """Submit `total` runs spread evenly over `users`, all at once from `threads` threads (each user with
    its own HTTP client, as separate people would), interleaving the users' requests."""
    jobs = [(users[i % len(users)], i // len(users)) for i in range(total)]
    clients = {user: server.client(user) for user in users}
    load = Load({user: [] for user in users}, [], [], 0.0)

    def submit(job: tuple[str, int]) -> None:
        user, i = job
        spec = load_spec(user, i, fail_every)
        try:
            answer = clients[user].post("runs", json={"spec": spec})
        except httpx.HTTPError as exc:   # no answer at all: counted as lost
            load.errors.append(f"{spec['name']}: {type(exc).__name__}: {exc}")
            return
        load.codes.append(answer.status_code)
        if answer.status_code == 201:
            load.names[user].append(answer.json()["name"])
        else:
            load.errors.append(f"{spec['name']}: {answer.status_code} {answer.text[:300]}")

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(submit, jobs))
    finally:
        for client in clients.values():
            client.close()
    load.seconds = time.monotonic() - started
    return load
