"""The control plane's HTTP API against a real `tessera server start` subprocess (conftest.py): keys,
team isolation, runs on the local cluster end to end, logs (whole and live), path traversal, the body
limit, secrets that never come back, the audit log and the database's migrations."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, quote_plus

import httpx
import pytest
from alembic.script import ScriptDirectory
from server.conftest import SERVER_CLI, start_server, stop_server

from tessera.platform.server.accounts import Accounts
from tessera.platform.store.db import MIGRATIONS, make_engine, session_factory


@pytest.fixture(scope="module")
def hello_run(server):  # type: ignore[no-untyped-def]
    """alice's run: prints hello and the value of her secret (which the logs must hide)."""
    with server.client("alice") as api:
        made = api.post("secrets", json={"type": "env", "name": "token", "values": {"TOKEN": "s3cr3t-value-42"}})
        assert made.status_code == 201, made.text
        spec = {"name": "hello", "command": "echo hello; echo token=$TOKEN", "secrets": ["token"]}
        submitted = api.post("runs", json={"spec": spec})
        assert submitted.status_code == 201, submitted.text
    return server.wait_done("alice", "hello")


def test_requests_without_a_valid_key_get_401(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as anonymous:
        assert anonymous.get("health").json()["ok"] is True
        for path in ("runs", "runs/hello", "clusters", "secrets", "whoami", "audit"):
            answer = anonymous.get(path)
            assert answer.status_code == 401, path
            assert isinstance(answer.json()["detail"], str)
        assert anonymous.get("whoami", headers={"Authorization": "Bearer tsk_" + "x" * 43}).status_code == 401
        assert anonymous.get("whoami", headers={"X-API-Key": server.keys["alice"] + "x"}).status_code == 401
        assert anonymous.get("whoami", headers={"X-API-Key": server.keys["alice"]}).json() == {
            "user": "alice", "team": "red", "admin": False}


def test_a_run_completes_and_only_its_team_sees_it(server, hello_run) -> None:  # type: ignore[no-untyped-def]
    assert hello_run["status"] == "COMPLETED" and hello_run["user"] == "alice"
    with server.client("alice") as alice, server.client("bob") as bob:
        listed = alice.get("runs").json()
        assert listed["total"] == 1 and listed["items"][0]["name"] == "hello"
        assert listed["items"][0]["user"] == "alice" and listed["next_cursor"] is None
        assert bob.get("runs/hello").status_code == 404
        assert bob.get("runs/hello/logs").status_code == 404
        assert bob.post("runs/hello/stop").status_code == 404
        assert bob.delete("runs/hello").status_code == 404
        assert bob.get("runs").json() == {"items": [], "next_cursor": None, "total": 0}
        duplicate = alice.post("runs", json={"spec": {"name": "hello", "command": "true"}})
        assert duplicate.status_code == 409
        invalid = alice.post("runs", json={"spec": {"name": "broken"}})
        assert invalid.status_code == 422 and "command" in invalid.json()["detail"]
        events = alice.get("runs/hello/events").json()["items"]
        first = alice.get("runs/hello/events", params={"limit": 1}).json()
        assert events[0]["kind"] == "created" and first["items"] == events[:1]
        assert alice.get("runs/hello/events", params={"cursor": first["next_cursor"]}).json()["items"] == events[1:]
        assert alice.get("runs/hello/metrics").json() == {"rows": [], "next": 0}   # echo reports none


def test_clusters_belong_to_their_team(server) -> None:  # type: ignore[no-untyped-def]
    with server.client("alice") as alice, server.client("bob") as bob:
        assert alice.post("clusters", json={"name": "box", "type": "local"}).status_code == 201
        assert [c["name"] for c in alice.get("clusters").json()["clusters"]] == ["box", "local"]
        assert "nodes" in alice.get("clusters/box").json()
        assert [c["name"] for c in bob.get("clusters").json()["clusters"]] == ["local"]
        assert bob.get("clusters/box").status_code == 404 and bob.delete("clusters/box").status_code == 404
        assert alice.post("clusters/box/nodes/n1/clear").json() == {"cluster": "box", "node": "n1", "cleared": False}
        assert alice.post("clusters", json={"name": "box", "type": "local"}).status_code == 400
        assert alice.delete("clusters/box").status_code == 204
        assert alice.get("clusters/box").status_code == 404
        actions = [(e["action"], e["target"]) for e in alice.get("audit").json()["items"][:3]]
        assert actions == [("cluster remove", "box"), ("node clear", "box/n1"), ("cluster add", "box")]


def test_logs_whole_and_followed_hide_secret_values(server, hello_run) -> None:  # type: ignore[no-untyped-def]
    with server.client("alice") as alice:
        text = alice.get("runs/hello/logs").text
        assert "hello" in text.splitlines() and "token=****" in text
        with alice.stream("GET", "runs/hello/logs", params={"follow": 1}) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = "".join(stream.iter_text())
        assert "data: hello\n\n" in events and events.endswith("event: end\ndata: COMPLETED\n\n")
        assert alice.get("runs/hello/logs", params={"rank": 5}).status_code == 404
        assert alice.get("runs/hello/logs", params={"rank": -1}).status_code == 422


def test_secrets_never_come_back(server, hello_run) -> None:  # type: ignore[no-untyped-def]
    with server.client("alice") as alice:
        answers = [alice.get("secrets"), alice.get("runs/hello"), alice.get("runs/hello/events"),
                   alice.get("runs/hello/logs"), alice.get("audit"), alice.get("runs")]
        again = alice.post("secrets", json={"type": "env", "name": "token", "values": {"TOKEN": "s3cr3t-value-42"}})
        assert again.status_code == 409
        for answer in [*answers, again]:
            assert "s3cr3t-value-42" not in answer.text
        assert alice.get("secrets").json()["secrets"][0]["exposes"] == ["TOKEN"]
    at_rest = [p for p in server.home.rglob("*") if p.is_file() and not p.name.endswith(".log")]  # logs: the run's own
    assert at_rest and not [p for p in at_rest if b"s3cr3t-value-42" in p.read_bytes()]


def test_path_traversal_names_are_refused_without_touching_files(server) -> None:  # type: ignore[no-untyped-def]
    before = sorted((p, p.stat().st_mtime_ns) for p in server.home.rglob("*") if p.name != "server.db-wal"
                    and not p.name.endswith((".log", ".db-shm", "state.db-wal")))
    with httpx.Client(base_url=server.url, headers={"X-API-Key": server.keys["alice"]}) as alice:
        for path in ("/api/v1/runs/..%2F..%2Fserver.db", "/api/v1/runs/a..b", "/api/v1/runs/..", "/api/v1/runs/%2e%2e",
                     "/api/v1/secrets/..%2Fteams", "/api/v1/clusters/a..b"):
            for method in ("GET", "DELETE"):
                answer = alice.request(method, path)
                assert answer.status_code in (400, 404, 405), (method, path, answer.status_code)
        assert alice.post("/api/v1/runs/hello/clone", json={"name": "../x"}).status_code == 422
    after = sorted((p, p.stat().st_mtime_ns) for p in server.home.rglob("*") if p.name != "server.db-wal"
                   and not p.name.endswith((".log", ".db-shm", "state.db-wal")))
    assert (server.home / "server.db").exists() and [p for p, _ in after] == [p for p, _ in before]


def test_bodies_over_one_mib_get_413(server) -> None:  # type: ignore[no-untyped-def]
    big = b'{"spec": {"name": "x", "command": "' + b"a" * (2 * 1024 * 1024) + b'"}}'
    with server.client("alice") as alice:
        assert alice.post("runs", content=big, headers={"Content-Type": "application/json"}).status_code == 413
        chunks = (big[i:i + 65536] for i in range(0, len(big), 65536))   # no Content-Length: counted
        assert alice.post("runs", content=chunks, headers={"Content-Type": "application/json"}).status_code == 413
        assert alice.get("runs/x").status_code == 404


def test_audit_names_who_did_what_per_team(server, hello_run) -> None:  # type: ignore[no-untyped-def]
    with server.client("alice") as alice, server.client("bob") as bob:
        entries = alice.get("audit").json()["items"]
        assert {(e["user"], e["action"], e["target"]) for e in entries} >= {
            ("alice", "submit", "hello"), ("alice", "secret create", "token")}
        assert bob.get("audit").json()["items"] == []
        assert alice.get("admin/users").status_code == 403


def test_keys_are_stored_hashed_and_kept_out_of_the_access_log(server) -> None:  # type: ignore[no-untyped-def]
    key = server.keys["bob"]
    assert httpx.get(f"{server.url}/?api_key={key}").status_code == 200   # the console's login link
    encoded = key.replace("_", "%5F")                                      # as some clients write it
    assert httpx.get(f"{server.url}/?api_key={encoded}").status_code == 200
    deadline = time.monotonic() + 5
    while "GET /?api_key=tsk%5F**** HTTP/1.1" not in server.log.read_text():
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.05)
    assert "GET /?api_key=tsk_**** HTTP/1.1" in server.log.read_text()
    assert key not in server.log.read_text() and encoded not in server.log.read_text()
    stored = b"".join(p.read_bytes() for p in server.home.glob("server.db*"))
    assert key.encode() not in stored
    with sqlite3.connect(server.home / "server.db") as db:
        hashes = {row[0] for row in db.execute("SELECT hash FROM api_keys")}
    assert hashlib.sha256(key.encode()).hexdigest() in hashes


def test_migrations_are_at_head_and_a_second_start_works(server) -> None:  # type: ignore[no-untyped-def]
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    with sqlite3.connect(server.home / "server.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
    url, process, _ = start_server(server.home.parent, server.home, server.env)
    try:
        with httpx.Client(base_url=f"{url}/api/v1/", headers={"X-API-Key": server.keys["alice"]}) as alice:
            assert alice.get("whoami").json()["user"] == "alice"
    finally:
        stop_server(process)


def _open_files(pid: int) -> int:
    """How many file descriptors the server holds besides its database pool's (which keeps connections
    open by design): each follower holds a socket and its readers of the run's log chunks."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += ".db" not in os.readlink(fd)
        except FileNotFoundError:   # closed while we looked
            continue
    return count


def test_quiet_runs_followers_hold_no_worker_thread_and_leave_nothing_open(server) -> None:  # type: ignore[no-untyped-def]
    """A run that prints nothing: more followers than the server has worker threads (40) must not stop
    the API, and followers that disconnect must not leave a reader (and its connection) behind."""
    with server.client("alice") as alice:
        assert alice.post("runs", json={"spec": {"name": "quiet", "command": "sleep 60"}}).status_code == 201
        deadline = time.monotonic() + 20
        while not alice.get("runs/quiet").json()["resumptions"]:   # launched (RUNNING needs a heartbeat)
            assert time.monotonic() < deadline, "run quiet did not start"
            time.sleep(0.1)
        before = _open_files(server.process.pid)
        with contextlib.ExitStack() as streams, server.client("alice", connections=64) as followers:
            for _ in range(45):
                stream = streams.enter_context(followers.stream("GET", "runs/quiet/logs", params={"follow": 1}))
                assert stream.status_code == 200
            assert alice.get("runs", timeout=10).json()["total"] >= 2
        deadline = time.monotonic() + 10
        # 45 followers leaking a socket or a reader each would leave 45 or more; a few are the pool's
        while _open_files(server.process.pid) > before + 8:
            assert time.monotonic() < deadline, f"{_open_files(server.process.pid) - before} more files left open"
            time.sleep(0.1)
        assert alice.post("runs/quiet/stop").status_code == 200
        assert server.wait_done("alice", "quiet")["status"] == "STOPPED"
        assert alice.delete("runs/quiet").status_code == 204
        assert alice.get("runs/quiet").status_code == 404
        actions = [(e["action"], e["target"]) for e in alice.get("audit").json()["items"][:3]]
        assert actions == [("delete", "quiet"), ("stop", "quiet"), ("submit", "quiet")]


def test_admins_manage_users_and_keys_and_revoked_keys_get_401(server, hello_run) -> None:  # type: ignore[no-untyped-def]
    accounts = Accounts(session_factory(make_engine(f"sqlite:///{server.home / 'server.db'}")))
    root = accounts.create_user("root", "ops", admin=True)    # on the host, as `admin create-user --admin`
    with server.client() as api:
        as_root = {"X-API-Key": root}
        made = api.post("admin/users", json={"name": "carol", "team": "red"}, headers=as_root)
        assert made.status_code == 201 and made.json()["team"] == "red"
        assert api.post("admin/users", json={"name": "carol", "team": "blue"}, headers=as_root).status_code == 409
        first = {"X-API-Key": made.json()["api_key"]}
        assert api.get("runs/hello", headers=first).json()["user"] == "alice"     # carol is in alice's team
        second = api.post("admin/users/carol/keys", headers=as_root).json()["api_key"]
        assert api.get("whoami", headers={"X-API-Key": second}).json()["user"] == "carol"
        revoked = subprocess.run([*SERVER_CLI, "admin", "revoke-key", second[:12], "--home", str(server.home)],
                                 capture_output=True, text=True, env=server.env, timeout=60)
        assert revoked.returncode == 0 and revoked.stdout == "", revoked.stderr
        assert api.get("whoami", headers={"X-API-Key": second}).status_code == 401
        assert api.get("whoami", headers=first).status_code == 200
        users = {u.name: u for u in accounts.list_users()}
        assert users["carol"].keys == [made.json()["api_key"][:12]] and users["root"].admin
        audit = [(e["user"], e["action"], e["target"]) for e in api.get("audit", headers=as_root).json()["items"]]
        assert ("root", "user create", "carol") in audit


@pytest.mark.parametrize("query", [{"limit": 1001}, {"limit": 0}, {"cursor": "not-a-cursor"}, {"q": "x" * 64},
                                   {"status": "DANCING"}, {"user": "a..b"}])
def test_list_bounds_are_refused_in_one_line(server, query) -> None:  # type: ignore[no-untyped-def]
    with server.client("alice") as alice:
        answer = alice.get("runs", params=query)
    assert answer.status_code in (400, 422) and "\n" not in answer.json()["detail"]


def test_names_are_bounded_at_creation_in_one_line(server) -> None:  # type: ignore[no-untyped-def]
    """A 300-character name of a secret, a cluster or a run, and a 300-byte file name of a file secret
    (whose run stayed PENDING forever): 422, one line naming the value and the bound; nothing is made."""
    long, start = "a" * 300, f"'{'a' * 32}...'"
    with server.client("alice") as alice:
        answers = {
            "secret": alice.post("secrets", json={"type": "env", "name": long, "values": {"A": "b"}}),
            "cluster": alice.post("clusters", json={"name": long, "type": "local"}),
            "run": alice.post("runs", json={"spec": {"name": long, "command": "true"}}),
            "file": alice.post("secrets", json={"type": "file", "name": "f", "filename": long, "env_var": "F",
                                                "content": "aGk="}),
        }
        assert {what: (a.status_code, a.json()["detail"]) for what, a in answers.items()} == {
            "secret": (422, f"name: secret name {start} is 300 characters long; at most 63 are allowed"),
            "cluster": (422, f"name: cluster name {start} is 300 characters long; at most 63 are allowed"),
            "run": (422, f"run spec is invalid: - name: run name {start} is 300 characters long; at most 63 are "
                         "allowed"),
            "file": (422, f"invalid file secret 'f': filename: file name {start} is 300 bytes long; at most 128 "
                          "are allowed (it is written as a file in the run's folder)"),
        }
        assert not {long, "f"} & {s["name"] for s in alice.get("secrets").json()["secrets"]}
        assert long not in {c["name"] for c in alice.get("clusters").json()["clusters"]}
        assert alice.post("clusters", json={"name": "c" * 63, "type": "local"}).status_code == 201   # the bound
        assert alice.delete(f"clusters/{'c' * 63}").status_code == 204


def test_metrics_and_logs_mask_secret_values_and_api_keys_in_every_form(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The run prints, and writes into its metrics, a secret's value as it is, URL-encoded and in base64,
    and an API key (stored nowhere) as it is, URL-encoded (`tsk%5F...`) and in base64. The metrics endpoint
    returned all of them; the logs hid only the plain value."""
    value, key = "p@ss word/42+x", "tsk_" + "Q1w2E3r4T5y6U7i8O9p0_A1s2D3f4G5h6J7k8L9z0X1c"
    script = tmp_path / "leak.py"
    script.write_text(f"""import base64, json, os, urllib.parse
value, key = os.environ["MIXED"], {key!r}
forms = {{"raw": value, "url": urllib.parse.quote(value, safe=""), "plus": urllib.parse.quote_plus(value),
         "b64": base64.b64encode(("user:" + value).encode()).decode(), "key": key,
         "key_url": key.replace("_", "%5F"), "key_b64": base64.b64encode(("Bearer " + key).encode()).decode()}}
for name, text in forms.items():
    print(name + "=" + text)
with open(os.environ["TESSERA_METRICS"], "a") as f:
    f.write(json.dumps({{"step": 1, "loss": 0.5, **forms, value: 2}}) + "\\n")
""")
    with server.client("alice") as alice:
        made = alice.post("secrets", json={"type": "env", "name": "mixed", "values": {"MIXED": value}})
        assert made.status_code == 201, made.text
        spec = {"name": "leaky-metrics", "command": f"{sys.executable} {script}", "secrets": ["mixed"]}
        assert alice.post("runs", json={"spec": spec}).status_code == 201
        assert server.wait_done("alice", "leaky-metrics")["status"] == "COMPLETED"
        rows = alice.get("runs/leaky-metrics/metrics").json()["rows"]
        logs = alice.get("runs/leaky-metrics/logs").text
    user_b64 = base64.b64encode(b"user:").decode()[:6]          # 'dXNlcj': what the value's bytes leave alone
    assert rows == [{"step": 1, "loss": 0.5, "raw": "****", "url": "****", "plus": "****",
                     "b64": rows[0]["b64"], "key": "tsk_****", "key_url": "tsk%5F****",
                     "key_b64": rows[0]["key_b64"], "****": 2}]
    assert rows[0]["b64"].startswith(user_b64) and "****" in rows[0]["b64"] and len(rows[0]["b64"]) <= 16
    assert rows[0]["key_b64"].startswith("QmVhcmVy") and rows[0]["key_b64"].rstrip("=").endswith("****")
    assert logs.splitlines()[:6] == ["raw=****", "url=****", "plus=****", f"b64={rows[0]['b64']}",
                                     "key=tsk_****", "key_url=tsk%5F****"]
    assert logs.splitlines()[6] == f"key_b64={rows[0]['key_b64']}"
    for leaked in (value, quote(value, safe=""), quote_plus(value), key, key.replace("_", "%5F"), key[4:]):
        assert leaked not in logs and leaked not in json.dumps(rows)
