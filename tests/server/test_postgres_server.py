"""The server on PostgreSQL end to end: a throwaway cluster from Debian's packages (scripts/postgres-up.sh)
and a real `tessera server start --db postgresql+psycopg://...` subprocess. The migrations create the
schema at the first start and are a no-op at the next; users of two teams, a run through the API, team
scoping and the audit log all live in PostgreSQL, and survive the server's restart."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from server_proc import SCRIPTS, Postgres, ServerProcess, fresh_database, server_env, wait_all_done
from typer.testing import CliRunner

from tessera.cli.server import app as server_cli
from tessera.platform.clusters.local import free_port
from tessera.platform.store.db import MIGRATIONS
from tessera.platform.supervision.supervisor import stop_supervisor


def _head() -> str:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config).get_current_head() or ""


@pytest.fixture(scope="module")
def postgres(postgres_cluster: Postgres) -> Postgres:
    return fresh_database(postgres_cluster, "server")


@pytest.fixture(scope="module")
def pg_server(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """alice (team red) and bob (team blue) on a server whose database is PostgreSQL; alice's run submitted."""
    folder = tmp_path_factory.mktemp("pg-server")
    server = ServerProcess(folder, folder / "server-home", server_env(folder), db=postgres.url)
    server.start()
    try:
        server.add_users({"alice": "red", "bob": "blue"})
        with server.client("alice") as alice:
            made = alice.post("runs", json={"spec": {"name": "pg-hello", "command": "echo hello from postgres"}})
            assert made.status_code == 201, made.text
        yield server
    finally:
        server.stop()
        for team_home in (server.home / "teams").glob("*"):
            stop_supervisor(team_home)


def sql(postgres: Postgres, query: str) -> list[tuple[object, ...]]:
    """Rows of `query`, read straight from PostgreSQL (not through the server)."""
    with psycopg.connect(postgres.url.replace("postgresql+psycopg://", "postgresql://")) as db:
        return db.execute(query).fetchall()


def wait_completed(server: ServerProcess, user: str, name: str) -> dict[str, object]:
    runs = {r["name"]: r for r in wait_all_done(server, user, 1, timeout=30)}
    return runs[name]


def test_the_first_start_migrates_postgres(postgres: Postgres, pg_server: ServerProcess) -> None:
    assert sql(postgres, "SELECT version_num FROM alembic_version") == [(_head(),)]
    tables = {row[0] for row in sql(postgres, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"teams", "users", "api_keys", "audit", "alembic_version"} <= tables
    assert sorted(sql(postgres, "SELECT name FROM teams")) == [("blue",), ("red",)]
    hashes = {row[0] for row in sql(postgres, "SELECT hash FROM api_keys")}
    assert len(hashes) == 2 and not {pg_server.keys["alice"], pg_server.keys["bob"]} & hashes


def test_runs_are_scoped_to_the_team_and_audited(postgres: Postgres, pg_server: ServerProcess) -> None:
    run = wait_completed(pg_server, "alice", "pg-hello")
    assert run["status"] == "COMPLETED" and run["user"] == "alice"
    with pg_server.client("alice") as alice, pg_server.client("bob") as bob:
        assert "hello from postgres" in alice.get("runs/pg-hello/logs").text
        assert bob.get("runs/pg-hello").status_code == 404
        assert bob.get("runs/pg-hello/logs").status_code == 404
        assert bob.get("runs").json() == {"items": [], "next_cursor": None, "total": 0}
        assert [(e["user"], e["action"], e["target"]) for e in alice.get("audit").json()["items"]
                if e["action"] == "submit"] == [("alice", "submit", "pg-hello")]
        assert bob.get("audit").json()["items"] == []
    assert ("alice", "red", "submit", "pg-hello") in sql(postgres, 'SELECT "user", team, action, target FROM audit')


def test_a_restarted_server_keeps_its_data(postgres: Postgres, pg_server: ServerProcess) -> None:
    wait_completed(pg_server, "alice", "pg-hello")
    audit_before = sql(postgres, "SELECT count(*) FROM audit")
    pg_server.stop()
    pg_server.start()
    assert sql(postgres, "SELECT version_num FROM alembic_version") == [(_head(),)]
    assert sql(postgres, "SELECT count(*) FROM audit") == audit_before
    with pg_server.client("alice") as alice, pg_server.client("bob") as bob:
        assert alice.get("whoami").json() == {"user": "alice", "team": "red", "admin": False}
        assert bob.get("whoami").json() == {"user": "bob", "team": "blue", "admin": False}
        listed = alice.get("runs").json()
        assert [(r["name"], r["status"]) for r in listed["items"]] == [("pg-hello", "COMPLETED")]
        assert any(e["target"] == "pg-hello" for e in alice.get("audit").json()["items"])
        assert bob.get("runs/pg-hello").status_code == 404
    with pg_server.client() as anonymous:
        assert anonymous.get("runs").status_code == 401


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    """A PostgreSQL URL nobody listens on: one line naming the database (password hidden), exit 1."""
    url = f"postgresql+psycopg://tessera:hunter2@127.0.0.1:{free_port()}/nothing"
    done = CliRunner().invoke(server_cli, ["admin", "list-users", "--home", str(tmp_path), "--db", url])
    assert done.exit_code == 1, done.output
    assert "Traceback" not in done.output and "hunter2" not in done.output
    assert "cannot open the server database" in done.output


def test_postgres_up_again_finds_the_running_server(postgres: Postgres, pg_server: ServerProcess) -> None:
    """scripts/postgres-up.sh on a folder whose server runs: the same URL (its real port, whatever port is
    asked for), the database and its tables kept."""
    again = subprocess.run([str(SCRIPTS / "postgres-up.sh"), str(postgres.folder), str(free_port()),
                            postgres.url.rsplit("/", 1)[1]], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == postgres.url and again.stderr == ""
    assert sorted(sql(postgres, "SELECT name FROM teams")) == [("blue",), ("red",)]
