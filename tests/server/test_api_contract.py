"""The one typed API agrees with itself (issue 23, "One typed API"):

- the interface (api/interface.py) against its two implementations, `Platform` and `RemotePlatform`
  (and the secrets' interface against `SecretStore` and `RemoteSecrets`): the same methods, parameters,
  defaults and types;
- the OpenAPI document: every 2xx JSON answer under /api/v1 and every request body is a model with named
  properties; every request of the client (transport.ROUTES) and of the console (static/api.js, parsed)
  is a route with that method, and every route is someone's;
- errors: each row of the problems table survives the trip (exception -> problem+json -> the client's
  exception, the same class), and each error the API answers in process is a problem with its code;
- cursor paging: 120 runs in pages of 50, none twice, none missed, while runs are submitted between
  pages; filters; the audit log's and a run's events' pages;
- through a real server (server_proc.py's): RemotePlatform raises the class the in-process Platform raises
  for the same failure.
"""

from __future__ import annotations

import inspect
import json
import re
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_proc import ServerProcess, server_env

from tessera.platform.api import interface
from tessera.platform.api.client import RemotePlatform, RemoteSecrets
from tessera.platform.api.problems import BY_CODE, ERRORS, PROBLEM_JSON, PROBLEMS, for_exception
from tessera.platform.api.sdk import Platform
from tessera.platform.api.transport import ROUTES, error_from
from tessera.platform.secrets.vault import SecretStore
from tessera.platform.server.accounts import Accounts
from tessera.platform.server.app import API, STATIC, create_app
from tessera.platform.server.problems import problem_response
from tessera.platform.server.settings import ServerSettings
from tessera.platform.spec.run_spec import validate_spec
from tessera.platform.store.db import make_engine, session_factory
from tessera.platform.store.state import PENDING, RunRecord, new_run_id

# Interface methods the client makes of other calls (no request of their own).
COMPOSED = {"close", "list_runs", "count_runs", "run_summaries", "wait_for_run_status"}
# Routes only the server's own tools call (the admin CLI's, an operator's curl), not the platform's interface.
SERVER_ONLY = {("GET", "/health"), ("GET", "/audit"), ("GET", "/admin/users"), ("POST", "/admin/users"),
               ("POST", "/admin/teams"), ("POST", "/admin/users/{name}/keys"), ("DELETE", "/admin/keys/{prefix}")}


# --- the interface and its implementations ---------------------------------------------------------


def _members(protocol: type) -> list[str]:
    return [name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")]


def _agrees(declared: Any, implemented: Any, where: str) -> None:
    """`implemented` takes every parameter `declared` has (same name, kind, default; `...` leaves the
    default to it), further ones only keyword-only with defaults, and has the same types."""
    want, have = inspect.signature(declared), inspect.signature(implemented)
    extra = [p for name, p in have.parameters.items() if name not in want.parameters]
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in extra), (where, extra)
    assert [p for p in have.parameters if p in want.parameters] == list(want.parameters), where
    for name, p in want.parameters.items():
        got = have.parameters[name]
        assert got.kind is p.kind, (where, name)
        assert got.default is not p.empty if p.default is ... else got.default == p.default, (where, name)
    hints, got_hints = typing.get_type_hints(declared), typing.get_type_hints(implemented)
    assert {k: got_hints.get(k) for k in hints} == hints, where


@pytest.mark.parametrize("protocol, implementations", [
    (interface.PlatformAPI, (Platform, RemotePlatform)),
    (interface.SecretsAPI, (SecretStore, RemoteSecrets)),
])
def test_both_implementations_have_the_interface(protocol: type, implementations: tuple[type, ...]) -> None:
    methods = _members(protocol)
    assert len(methods) >= 6
    for cls in implementations:
        for name in methods:
            _agrees(getattr(protocol, name), getattr(cls, name), f"{cls.__name__}.{name}")


# --- the OpenAPI document ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return create_app(ServerSettings.resolve(home=tmp_path_factory.mktemp("contract") / "server"))


@pytest.fixture(scope="module")
def openapi(app: Any) -> dict[str, Any]:
    return app.openapi()


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method, path after /api/v1, operation) of every operation under /api/v1."""
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if path.startswith(API + "/"):
                yield method.upper(), path.removeprefix(API), operation


def _properties(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The named properties of a schema (a model's; an optional body's model)."""
    refs = [s for s in schema.get("anyOf", ()) if "$ref" in s]
    schema = refs[0] if len(refs) == 1 and all(s == refs[0] or s == {"type": "null"} for s in schema["anyOf"]) \
        else schema
    if "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return dict(schema.get("properties") or {})


def test_every_answer_and_body_is_a_model_with_named_properties(openapi: dict[str, Any]) -> None:
    answers = bodies = 0
    for method, path, operation in _operations(openapi):
        for status, response in operation["responses"].items():
            content = response.get("content", {})
            if status.startswith("2") and "application/json" in content:
                answers += 1
                assert _properties(openapi, content["application/json"]["schema"]), (method, path, status)
            elif not status.startswith("2"):
                assert list(content) == [PROBLEM_JSON], (method, path, status)
        if "requestBody" in operation:
            bodies += 1
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            assert _properties(openapi, schema), (method, path, "body")
    assert (answers, bodies) == (23, 9)


def _console_calls() -> list[tuple[str, str]]:
    """(method, path) of every call in static/api.js; no other file of the console calls the server."""
    text = (STATIC / "api.js").read_text()
    calls = re.findall(r'(?:call|streamEvents)\("([A-Z]+)", "(/[^"]*)"', text)
    assert text.count("await fetch(") == 2   # in call() and streamEvents()
    for other in STATIC.glob("*.js"):
        assert other.name == "api.js" or "fetch(" not in other.read_text(), other.name
    return calls


def test_the_clients_and_the_consoles_calls_are_the_servers_routes(openapi: dict[str, Any]) -> None:
    routes = {(method, path) for method, path, _ in _operations(openapi)}
    client = {(method, "/" + path) for method, path in ROUTES.values()}
    console = set(_console_calls())
    assert len(console) >= 12
    assert client - routes == set() and console - routes == set()
    assert routes - client - console == SERVER_ONLY   # every route is called by someone
    methods = set(_members(interface.PlatformAPI))
    assert methods - COMPOSED == {name for name in ROUTES if "." not in name and name != "whoami"}
    assert {name.split(".")[1] for name in ROUTES if name.startswith("secrets.")} <= set(
        _members(interface.SecretsAPI))


# --- errors -------------------------------------------------------------------------------------------


def test_each_error_class_comes_back_as_itself() -> None:
    """Exception -> the server's problem answer -> the client's exception: the same class, the same
    message, for every row the platform raises; the codes are unique."""
    assert len(BY_CODE) == len(PROBLEMS)
    for problem in ERRORS:
        raised = problem.error("bad thing: one\n- two")
        assert for_exception(raised) is problem
        answer = problem_response(problem, str(raised))
        body = json.loads(bytes(answer.body))
        assert (answer.status_code, answer.media_type) == (problem.status, PROBLEM_JSON)
        assert body == {"type": problem.type, "title": problem.title, "status": problem.status,
                        "detail": "bad thing: one; - two", "code": problem.code}
        back = error_from(answer.status_code, bytes(answer.body), "runs", "http://x")
        assert (type(back), str(back)) == (problem.error, "bad thing: one; - two"), problem.code
    assert type(error_from(502, b"<html>Bad Gateway</html>", "runs", "http://x")).__name__ == "RemoteError"


@pytest.fixture(scope="module")
def team(app: Any) -> Iterator[tuple[TestClient, Platform, dict[str, str]]]:
    """An in-process client, alice's team's Platform (runs made unsupervised) and the keys of alice
    (team red), bob (team blue) and root (admin)."""
    accounts = app.state.server.accounts
    keys = {"alice": accounts.create_user("alice", "red"), "bob": accounts.create_user("bob", "blue"),
            "root": accounts.create_user("root", "ops", admin=True)}
    platform = app.state.server.teams.open("red")
    try:
        yield TestClient(app), platform, keys
    finally:
        platform.close()


def _as(keys: dict[str, str], user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {keys[user]}"}


def test_errors_are_problems_with_their_code(team: tuple[TestClient, Platform, dict[str, str]]) -> None:
    api, platform, keys = team
    platform.create_run({"name": "taken", "command": "true"}, supervise=False)
    alice, root = _as(keys, "alice"), _as(keys, "root")
    asked = {
        "run_exists": api.post(f"{API}/runs", json={"spec": {"name": "taken", "command": "true"}}, headers=alice),
        "run_not_found": api.get(f"{API}/runs/nope", headers=alice),
        "run_state_conflict": api.post(f"{API}/runs/taken/move", json={"cluster": "local"}, headers=alice),
        "spec_invalid": api.post(f"{API}/runs", json={"spec": {"name": "x", "command": "true", "secrets": ["none"]}},
                                 headers=alice),
        "secret_not_found": api.delete(f"{API}/secrets/nope", headers=alice),
        "secret_invalid": api.post(f"{API}/secrets", json={"type": "env", "name": "s", "values": {"1A": "b"}},
                                   headers=alice),
        "cluster_not_found": api.get(f"{API}/clusters/nope", headers=alice),
        "cluster_error": api.post(f"{API}/clusters", json={"name": "c", "type": "warp"}, headers=alice),
        "account_exists": api.post(f"{API}/admin/users", json={"name": "alice", "team": "red"}, headers=root),
        "account_not_found": api.post(f"{API}/admin/users/nobody/keys", headers=root),
        "value_invalid": api.get(f"{API}/runs", params={"status": "DANCING"}, headers=alice),
        "request_invalid": api.get(f"{API}/runs", params={"limit": 0}, headers=alice),
        "unauthorized": api.get(f"{API}/runs"),
        "forbidden": api.get(f"{API}/admin/users", headers=alice),
        "not_found": api.get(f"{API}/nothing-here", headers=alice),
        "method_not_allowed": api.put(f"{API}/runs", headers=alice),
        "too_large": api.post(f"{API}/runs", content=b"{" + b" " * (2 << 20) + b"}", headers={
            **alice, "Content-Type": "application/json"}),
    }
    api.post(f"{API}/secrets", json={"type": "env", "name": "s", "values": {"A": "b"}}, headers=alice)
    asked["secret_exists"] = api.post(f"{API}/secrets", json={"type": "env", "name": "s", "values": {"A": "c"}},
                                      headers=alice)
    for code, answer in asked.items():
        body = answer.json()
        assert answer.headers["content-type"] == PROBLEM_JSON, code
        assert (body["code"], answer.status_code, body["status"]) == (code, BY_CODE[code].status, answer.status_code)
        assert set(body) == {"type", "title", "status", "detail", "code"} and "\n" not in body["detail"], code
    assert asked["unauthorized"].headers["www-authenticate"] == "Bearer"
    assert "'nope'" in asked["run_not_found"].json()["detail"]


# --- paging -------------------------------------------------------------------------------------------


def _names(api: TestClient, key: dict[str, str], **params: Any) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """Each page's run names and the page, following next_cursor."""
    cursor = None
    while True:
        page = api.get(f"{API}/runs", params={**params, "cursor": cursor}, headers=key).raise_for_status().json()
        yield [r["name"] for r in page["items"]], page
        if (cursor := page["next_cursor"]) is None:
            return


def _submitted(platform: Platform, name: str, user: str = "alice") -> str:
    """A run record as a submission leaves it (no folder: listing is the point, and 120 folders cost
    seconds of fsync)."""
    now = time.time()
    spec = validate_spec({"name": name, "command": "true"}).model_dump(mode="json")
    platform.db.insert_run(RunRecord(new_run_id(), name, spec, PENDING, "local", now, now, "/nonexistent", user=user))
    return name


def test_runs_page_by_cursor_stable_while_runs_are_submitted(team: tuple[TestClient, Platform, dict[str, str]]
                                                             ) -> None:
    api, platform, keys = team
    made = [_submitted(platform, f"page-{i:03d}", "alice" if i % 3 else "carol") for i in range(120)]
    for name in made[:10]:
        platform.db.update_run(platform.get_run(name).id, status="FAILED")
    seen: list[str] = []
    sizes = []
    for i, (names, page) in enumerate(_names(api, _as(keys, "alice"), q="page-", limit=50)):
        seen += names
        sizes.append(len(names))
        _submitted(platform, f"page-late-{i}")   # between pages
        assert page["total"] == 120 + i
    assert (sizes, seen) == ([50, 50, 20], made[::-1])   # newest first, each once, none of the late ones
    failed = [n for names, _ in _names(api, _as(keys, "alice"), q="page-", status="FAILED,STOPPED", limit=4)
              for n in names]
    assert failed == made[9::-1]
    carol = [page for _, page in _names(api, _as(keys, "alice"), q="page-", user="carol", limit=30)]
    assert [len(p["items"]) for p in carol] == [30, 10] and {p["total"] for p in carol} == {40}
    assert {r["user"] for p in carol for r in p["items"]} == {"carol"}
    assert api.get(f"{API}/runs", headers=_as(keys, "bob")).json()["total"] == 0   # another team's


def test_audit_and_events_page_and_filter(team: tuple[TestClient, Platform, dict[str, str]]) -> None:
    api, platform, keys = team
    alice = _as(keys, "alice")
    for name in ("box-1", "box-2", "box-3"):
        api.post(f"{API}/clusters", json={"name": name, "type": "local"}, headers=alice).raise_for_status()
    api.delete(f"{API}/clusters/box-2", headers=alice).raise_for_status()
    first = api.get(f"{API}/audit", params={"action": "cluster add", "limit": 2}, headers=alice).json()
    rest = api.get(f"{API}/audit", params={"action": "cluster add", "limit": 2, "cursor": first["next_cursor"]},
                   headers=alice).json()
    assert [e["target"] for e in first["items"] + rest["items"]] == ["box-3", "box-2", "box-1"]
    assert rest["next_cursor"] is None
    assert [e["action"] for e in api.get(f"{API}/audit", params={"target": "box-2"}, headers=alice).json()[
        "items"]] == ["cluster remove", "cluster add"]
    assert api.get(f"{API}/audit", params={"user": "bob"}, headers=alice).json()["items"] == []

    platform.create_run({"name": "eventful", "command": "true"}, supervise=False)
    for retries in (1, 2):
        api.patch(f"{API}/runs/eventful", json={"max_retries": retries}, headers=alice).raise_for_status()
    page = api.get(f"{API}/runs/eventful/events", params={"limit": 2}, headers=alice).json()
    assert [e["kind"] for e in page["items"]] == ["created", "updated"] and page["resumptions"] == []
    last = api.get(f"{API}/runs/eventful/events", params={"cursor": page["next_cursor"]}, headers=alice).json()
    assert [e["message"] for e in last["items"]] == ["scheduling updated: max_retries: 1 -> 2"]
    polled = api.get(f"{API}/runs/eventful/events", params={"cursor": last["next_cursor"]}, headers=alice).json()
    assert (polled["items"], polled["next_cursor"]) == ([], last["next_cursor"])   # a poll: nothing new yet


# --- the client against a real server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real server; alice's key made in this process on its database (no admin CLI process to start)."""
    folder = tmp_path_factory.mktemp("contract-live")
    server = ServerProcess(folder, folder / "server-home", server_env(folder))
    server.start()
    try:
        engine = make_engine(f"sqlite:///{server.home / 'server.db'}")
        server.keys["alice"] = Accounts(session_factory(engine)).create_user("alice", "red")
        engine.dispose()
        yield server
    finally:
        server.stop()


def _raised(call: Any) -> type[Exception]:
    with pytest.raises(Exception) as caught:
        call()
    return type(caught.value)


def test_the_client_raises_what_the_platform_raises(live: ServerProcess, tmp_path: Path) -> None:
    local, remote = Platform(tmp_path / "home"), RemotePlatform(live.url, live.keys["alice"])
    try:
        for platform in (local, remote):
            platform.create_run({"name": "once", "command": "true"}, supervise=False)
            platform.secrets.create_env("token", {"TOKEN": "v"})
        failures = {
            "run exists": lambda p: p.create_run({"name": "once", "command": "true"}, supervise=False),
            "run not found": lambda p: p.get_run("never"),
            "moved to its own cluster": lambda p: p.move_run("once", "local"),
            "spec names no secret": lambda p: p.create_run({"name": "x", "command": "true", "secrets": ["no"]}),
            "secret exists": lambda p: p.secrets.create_env("token", {"TOKEN": "w"}),
            "secret not found": lambda p: p.secrets.remove("never"),
            "bad status": lambda p: p.run_page("DANCING"),
        }
        classes = {what: (_raised(lambda: call(local)), _raised(lambda: call(remote)))  # noqa: B023
                   for what, call in failures.items()}
        assert {what: pair[0] for what, pair in classes.items()} == {what: pair[1] for what, pair in classes.items()}
        assert [c.__name__ for c, _ in classes.values()] == ["RunExists", "RunNotFound", "RunStateError",
                                                            "SpecError", "SecretExists", "SecretNotFound",
                                                            "ValueError"]
        page = remote.run_page(limit=1)
        assert ([r.name for r in page.items], page.total, page.next_cursor) == (["once"], 1, None)
        assert [e.kind for e in remote.run_events("once").items][:1] == ["created"]
    finally:
        local.close()
        remote.close()
