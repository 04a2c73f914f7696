"""The server database on PostgreSQL (Debian's `postgresql` package): a throw-away cluster made with
initdb in a temporary folder, the migrations, accounts, audit and the API on it. Skipped, saying why, when
no PostgreSQL server binaries are installed (`apt-get install postgresql`) or psycopg is missing."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy import text

from tessera.platform.clusters.local import free_port
from tessera.platform.server.accounts import Accounts, hash_key
from tessera.platform.server.app import create_app
from tessera.platform.server.db import MIGRATIONS, make_engine, migrate, session_factory
from tessera.platform.server.settings import ServerSettings

pytest.importorskip("psycopg", reason="POSTGRES TESTS SKIPPED: psycopg is not installed (pip install 'tessera[postgres]')")


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("POSTGRES TESTS SKIPPED: no PostgreSQL server binaries (apt-get install postgresql)")
    # PostgreSQL refuses to run as root: as root, its files belong to the package's `postgres` user, in a
    # folder of their own (pytest's temporary folders are closed to other users).
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = Path(tempfile.mkdtemp(prefix="tessera-postgres-"))
    data = folder / "data"
    data.mkdir(mode=0o700)
    if prefix:
        shutil.chown(folder, "postgres")
        shutil.chown(data, "postgres")
    made = subprocess.run([*prefix, initdb, "-D", str(data), "-A", "trust", "-U", "tessera", "--no-sync"],
                          capture_output=True, text=True, timeout=120)
    if made.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"POSTGRES TESTS SKIPPED: initdb failed: {made.stderr.strip().splitlines()[-1:]}")
    port = free_port()
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
    started = subprocess.run([*prefix, pg_ctl, "-D", str(data), "-o", options, "-l", str(data / "log"), "-w",
                              "start"], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr + (data / "log").read_text()
    try:
        yield f"postgresql+psycopg://tessera@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True,
                       timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_server_runs_on_postgresql(postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path / "tessera-home"))
    monkeypatch.delenv("TESSERA_SECRET_KEY", raising=False)
    monkeypatch.setenv("TESSERA_SECRET_KEY_FILE", str(tmp_path / "secret.key"))   # undone after the test
    settings = ServerSettings.resolve(home=tmp_path / "server", db_url=postgres_url)
    app = create_app(settings)
    migrate(postgres_url)                      # a second start: nothing to do, nothing fails
    engine = make_engine(postgres_url)
    with engine.connect() as db:
        assert db.execute(text("SELECT version_num FROM alembic_version")).scalar() == \
            ScriptDirectory(str(MIGRATIONS)).get_current_head()
    key = Accounts(session_factory(engine)).create_user("dana", "green")
    with engine.connect() as db:
        assert db.execute(text("SELECT count(*) FROM api_keys WHERE hash = :h"),
                          {"h": hash_key(key)}).scalar() == 1
    with TestClient(app) as api:
        headers = {"X-API-Key": key}
        assert api.get("/api/v1/whoami", headers=headers).json() == {"user": "dana", "team": "green", "admin": False}
        assert api.get("/api/v1/whoami", headers={"X-API-Key": key[:-1] + "x"}).status_code == 401
        assert api.post("/api/v1/secrets", json={"type": "env", "name": "e", "values": {"A": "b" * 8}},
                        headers=headers).status_code == 201
        entries = api.get("/api/v1/audit", headers=headers).json()["entries"]
        assert [(e["user"], e["action"], e["target"]) for e in entries] == [("dana", "secret create", "e")]
    engine.dispose()
