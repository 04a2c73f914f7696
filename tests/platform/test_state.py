"""The one store (SQLite here): WAL and safe for several processes writing at once, names unique per team,
teams isolated, cursor pages stable under inserts, audit entries in the change's transaction, leases with
fencing tokens, and an old home's state.db imported without losing a row."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from old_home import build_old_home, write_old_secret
from sqlalchemy import text
from typer.testing import CliRunner

from tessera.cli.main import app as main_cli
from tessera.cli.server import app as server_cli
from tessera.platform.api.sdk import Platform
from tessera.platform.errors import RunExists
from tessera.platform.secrets.vault import SecretStore
from tessera.platform.store.audit import AuditNote, noting, page_entries, settle
from tessera.platform.store.db import shared_engine, sqlite_url
from tessera.platform.store.homes import import_home
from tessera.platform.store.leases import Fence, StaleLease, acquire, lease_of, release, renew
from tessera.platform.store.state import PENDING, RUNNING, RunRecord, StateDB, new_run_id


def _record(name: str, folder: Path, created: float | None = None, status: str = PENDING) -> RunRecord:
    now = created if created is not None else time.time()
    return RunRecord(new_run_id(), name, {"name": name}, status, "local", now, now, str(folder))


def _writer(home: str, run_id: str, count: int) -> None:
    db = StateDB.local(home)
    for i in range(count):
        db.add_event(run_id, "tick", f"event {i}")
        db.update_run(run_id, retries_used=i)


def test_wal_and_concurrent_writers(tmp_path: Path) -> None:
    db = StateDB.local(tmp_path)
    with db.engine.connect() as c:
        assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    assert (tmp_path / "store.db").stat().st_mode & 0o077 == 0
    run = _record("r", tmp_path)
    db.insert_run(run)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), run.id, 50)) for _ in range(3)]
    for p in procs:
        p.start()
    for _ in range(50):                        # a reader alongside never blocks or sees a torn state
        assert db.get_run("r").status == PENDING
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(db.events(run.id)) == 150


def test_node_faults_exclude_after_two_or_at_once_when_hard(tmp_path: Path) -> None:
    db = StateDB.local(tmp_path)
    assert db.record_node_fault("c", "n1", "crash") == (1, False)
    assert db.excluded_nodes("c") == []
    assert db.record_node_fault("c", "n1", "crash") == (2, True)
    assert db.record_node_fault("c", "n2", "NODE_FAIL", hard=True) == (1, True)
    assert db.excluded_nodes("c") == ["n1", "n2"] and db.excluded_nodes("other") == []
    assert db.clear_node("c", "n1") and db.excluded_nodes("c") == ["n2"]


def test_a_name_taken_between_check_and_insert_is_a_run_exists_error(tmp_path: Path) -> None:
    """Two submissions of one name that both passed the SDK's check: the database's unique (team, name)
    decides, and the loser gets RunExists (409 through the server), not a driver's error; another team
    may use the name."""
    engine = shared_engine(sqlite_url(tmp_path / "team.db"))
    red, blue = StateDB(engine, "red"), StateDB(engine, "blue")
    red.insert_run(_record("twin", tmp_path))
    with pytest.raises(RunExists, match="'twin' exists"):
        red.insert_run(_record("twin", tmp_path))
    blue.insert_run(_record("twin", tmp_path))
    assert [r.name for r in red.list_runs()] == ["twin"] and red.count_runs() == blue.count_runs() == 1
    assert red.get_run("twin").id != blue.get_run("twin").id
    assert blue.get_run(red.get_run("twin").id) is None          # an id of another team is not found


def test_cursor_pages_never_repeat_or_skip_a_run_when_runs_are_added(tmp_path: Path) -> None:
    db = StateDB(shared_engine(sqlite_url(tmp_path / "team.db")), "red")
    for i in range(7):
        db.insert_run(_record(f"r{i}", tmp_path, created=100.0 + i // 2))   # pairs share a created time
    page, cursor = db.page_runs(limit=3)
    seen = [r.name for r in page]
    assert seen[0] == "r6" and set(seen[1:]) == {"r4", "r5"}       # equal times: in id order
    db.insert_run(_record("late", tmp_path, created=200.0))                # newest: before page one
    while cursor:
        page, cursor = db.page_runs(cursor=cursor, limit=3)
        seen += [r.name for r in page]
    assert sorted(seen) == [f"r{i}" for i in range(7)] and len(seen) == 7
    assert db.page_runs(("RUNNING",), limit=5) == ([], None)
    with pytest.raises(ValueError, match="not a cursor of this list"):
        db.page_runs(cursor="bm90LWEtY3Vyc29y")


def test_audit_entry_commits_with_its_change_or_not_at_all(tmp_path: Path) -> None:
    engine = shared_engine(sqlite_url(tmp_path / "team.db"))
    db = StateDB(engine, "red")
    made = AuditNote("alice", "red", "submit", "one")
    with noting(made):
        db.insert_run(_record("one", tmp_path))
    settle(engine, made)
    refused = AuditNote("alice", "red", "submit", "one")
    with noting(refused), pytest.raises(RunExists):
        db.insert_run(_record("one", tmp_path))
    assert refused.id is None                                          # rolled back with the insert
    quiet = AuditNote("alice", "red", "stop", "one", "no change")        # a change that wrote nothing
    with noting(quiet):
        pass
    settle(engine, quiet)
    entries, cursor = page_entries(engine, "red")
    assert [(e.action, e.target) for e in entries] == [("stop", "one"), ("submit", "one")] and cursor is None
    assert page_entries(engine, "red", action="submit", limit=1)[0][0].id == made.id
    assert page_entries(engine, "blue") == ([], None)


def test_leases_fence_a_supervisor_that_lost_its_run(tmp_path: Path) -> None:
    engine = shared_engine(sqlite_url(tmp_path / "team.db"))
    db = StateDB(engine, "red")
    run = _record("leased", tmp_path)
    db.insert_run(run)
    [first] = acquire(engine, "A", seconds=30)
    assert (first.run_id, first.token, first.previous) == (run.id, 1, None)
    assert acquire(engine, "B", seconds=30) == []                       # held and not expired
    a = StateDB(engine, "red", fence=Fence("A", {run.id: 1}))
    a.update_run(run.id, status=RUNNING)
    assert lease_of(engine, run.id)[0] == "A"
    with engine.begin() as c:                                          # A stops renewing: it expires
        c.execute(text("UPDATE run_leases SET expires = 0"))
    [taken] = acquire(engine, "B", seconds=30)
    assert (taken.token, taken.previous) == (2, "A")
    with pytest.raises(StaleLease, match="held by B"):
        a.update_run(run.id, status=PENDING)
    assert db.get_run(run.id).status == RUNNING                        # A's late write was refused
    assert renew(engine, "A", 30) == [] and [lease.token for lease in renew(engine, "B", 30)] == [2]
    release(engine, "B")                                               # B shuts down: A may take it now
    assert lease_of(engine, run.id) == ("B", 0.0)
    [again] = acquire(engine, "A", seconds=30)
    assert (again.token, again.previous) == (3, "B")                    # tokens never repeat
    release(engine, "A", [run.id])                                      # the run ended
    assert lease_of(engine, run.id) is None


# --- homes made by the version before the one store ----------------------------------------------


def _store_rows(engine, team: str) -> dict[str, list[tuple]]:  # type: ignore[no-untyped-def]
    """The rows build_old_home wrote, as the store holds them now."""
    with engine.connect() as c:
        return {
            "runs": [tuple(r) for r in c.execute(text(
                "SELECT name, status, created, user FROM runs WHERE team = :t ORDER BY created"), {"t": team})],
            "resumptions": [tuple(r) for r in c.execute(text(
                "SELECT name, idx, resumptions.folder, events_offset FROM resumptions JOIN runs ON runs.id = run_id "
                "WHERE team = :t ORDER BY created, idx"), {"t": team})],
            "events": [tuple(r) for r in c.execute(text(
                "SELECT name, kind, message FROM events JOIN runs ON runs.id = run_id WHERE events.team = :t "
                "ORDER BY events.id"), {"t": team})]}


@pytest.mark.parametrize("version", [1, 3])
def test_an_old_home_arrives_whole_on_first_use_and_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        version: int) -> None:
    """Every run, resumption and event of an old state.db (schema SQL of commit 4c9037a), its cluster, node
    fault and secret files, in the store at the first use of the home; nothing twice at the next."""
    key = Fernet.generate_key()
    monkeypatch.setenv("TESSERA_SECRET_KEY", key.decode())
    home = tmp_path / "home"
    written = build_old_home(home, 120, version=version)
    write_old_secret(home, key, "token", {"API_TOKEN": "old-value-1"})
    before = (home / "state.db").read_bytes()
    platform = Platform(home)
    assert _store_rows(platform.db.engine, "local") == written
    assert platform.count_runs() == 120 and platform.get_run("old-0007").resumptions[1].last_heartbeat == {"step": 10}
    assert platform.list_clusters()[1]["partition"] == "gpu" and platform.db.excluded_nodes("slurm-a") == ["n1"]
    assert platform.secrets.get("token").env() == {"API_TOKEN": "old-value-1"}
    assert not (home / "secrets").exists()                      # imported, then removed
    assert (home / "state.db").read_bytes() == before            # the old file is left as it was
    assert StateDB.local(home).count_runs() == 120 and Platform(home).count_runs() == 120


def test_an_imported_run_keeps_its_name_unless_a_live_run_of_the_team_has_it(tmp_path: Path) -> None:
    """A name the team's live run has is taken: the old run is kept under the name plus its id; a deleted
    run's name is free (the unique name is over live runs), so the old run keeps it."""
    engine = shared_engine(sqlite_url(tmp_path / "team.db"))
    db = StateDB(engine, "red")
    for name in ("old-0001", "old-0002"):
        db.insert_run(_record(name, tmp_path))
    assert db.delete_run(db.get_run("old-0002").id, soft=True)
    build_old_home(tmp_path / "home", 3)
    assert import_home(engine, tmp_path / "home", "red") == 3
    assert sorted(r.name for r in db.list_runs()) == ["old-0000", "old-0001", "old-0001-000000000001", "old-0002"]
    assert db.count_runs(include_deleted=True) == 5


def test_server_migrate_imports_every_team_of_an_old_server_home(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    key = Fernet.generate_key()
    monkeypatch.setenv("TESSERA_SECRET_KEY", key.decode())
    server_home = tmp_path / "server"
    written = {team: build_old_home(server_home / "teams" / team, n) for team, n in (("red", 30), ("blue", 7))}
    write_old_secret(server_home / "teams" / "red", key, "creds", {"KEY": "red-secret-9"})
    url = sqlite_url(tmp_path / "server.db")
    runner = CliRunner()
    done = runner.invoke(server_cli, ["migrate", "--db", url, "--home", str(server_home)])
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[:2] == [f"team blue: 7 run(s) imported from {server_home}/teams/blue/state.db",
                                            f"team red: 30 run(s) imported from {server_home}/teams/red/state.db"]
    engine = shared_engine(url)
    assert {team: _store_rows(engine, team) for team in written} == written
    with engine.connect() as c:                                 # the ids both homes used: blue's first
        assert c.execute(text("SELECT team, COUNT(*) FROM runs WHERE id LIKE '0000000000%' GROUP BY team")).all() \
            == [("blue", 7), ("red", 23)]
    assert SecretStore(server_home / "teams" / "red", engine=engine, team="red").get("creds").env() == {"KEY": "red-secret-9"}
    again = runner.invoke(server_cli, ["migrate", "--db", url, "--home", str(server_home)])
    assert again.exit_code == 0 and "nothing to import" in again.output, again.output
    assert StateDB(engine, "red").count_runs() == 30
    monkeypatch.setenv("TESSERA_SECRET_KEY", Fernet.generate_key().decode())
    refused = runner.invoke(server_cli, ["migrate", "--db", url, "--home", str(server_home)])
    assert refused.exit_code == 1 and "is not the key of this store's secrets" in refused.output, refused.output


def test_an_old_home_whose_old_supervisor_runs_is_not_imported_until_it_stops(tmp_path: Path) -> None:
    """A supervisor of the older version holds the home's supervisor.lock (a real process here): importing
    then would leave it driving the runs from state.db beside the new store's supervisor, so the first
    command refuses in one line naming its pid; once it is gone, the home is imported."""
    home = tmp_path / "home"
    build_old_home(home, 3)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(600)",
                               str(home / "supervisor.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        (home / "supervisor.pid").write_text(str(holder.pid))
        refused = CliRunner().invoke(main_cli, ["run", "list"], env={"TESSERA_HOME": str(home), "TESSERA_API_URL": ""})
        assert refused.exit_code == 1, refused.output
        assert refused.output == (f"error: {home} is supervised by the supervisor of an older Tessera (pid {holder.pid}); "
                                  f"stop it (`kill {holder.pid}`: its runs keep going) and run this again, so that "
                                  "its runs move to the new store with one supervisor\n")
    finally:
        holder.kill()
        holder.wait()
    assert Platform(home).count_runs() == 3
