"""Races through a real `tessera server start` (SQLite database), with real concurrent HTTP clients:

- the same run name submitted by six clients at once: one 201, five 409 with one clear line, never a 500,
  and the winner's folder holds the winner's spec (the database decides before a file is written); a
  submission whose folder fails half-way is rolled back (in process);
- the same cluster name added by four clients at once: one 201, three 400 (as a second add gets);
- two updates of one run at once (priority, max_retries): both are stored, in the database and spec.yaml;
  of four deletions at once one gets 204, three 404;
- the same secret written by eight clients at once: without overwrite one 201 and seven 409, with
  overwrite eight 201; the stored secret always decrypts and holds an acknowledged value; of four
  removals at once one gets 204, three 404;
- `kill -9` of the server's process group during 50 concurrent submissions: after a restart every
  acknowledged run is listed, and every listed run has exactly one 'submit' audit entry (none for a run
  that does not exist).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from server_proc import ServerProcess, served

from tessera.platform.api.sdk import Platform
from tessera.platform.secrets.vault import SecretStore
from tessera.platform.store.db import shared_engine
from tessera.platform.store.state import PENDING, RunRecord, new_run_id

RACERS = 6
NAMES = 4


@pytest.fixture(scope="module")
def racer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(tmp_path_factory.mktemp("races"), {"alice": "red"}) as server:
        yield server


def _at_once(calls: list, api: httpx.Client) -> list[httpx.Response]:  # type: ignore[type-arg]
    """Each call(api) from its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(calls))

    def run(call) -> httpx.Response:  # type: ignore[no-untyped-def]
        barrier.wait()
        return call(api)
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _audit(api: httpx.Client, action: str) -> Counter[str]:
    entries = api.get("audit", params={"limit": 1000}).raise_for_status().json()["items"]
    return Counter(e["target"] for e in entries if e["action"] == action)


def test_same_run_name_one_winner_whose_spec_is_stored(racer: ServerProcess) -> None:
    names = [f"race-{n}" for n in range(NAMES)]
    calls = [lambda api, name=name, i=i: api.post("runs", json={"spec": {"name": name, "command": f"echo {name} by {i}"}})
             for name in names for i in range(RACERS)]
    with racer.client("alice") as api:
        answers = _at_once(calls, api)
        team = racer.home / "teams" / "red"
        for n, name in enumerate(names):
            mine = answers[n * RACERS:(n + 1) * RACERS]
            codes = sorted(a.status_code for a in mine)
            assert codes == [201] + [409] * (RACERS - 1), [a.text for a in mine]
            for lost in (a for a in mine if a.status_code == 409):
                assert lost.json()["detail"].startswith(f"a run named {name!r} exists"), lost.text
            won = next(a.json() for a in mine if a.status_code == 201)
            command = won["spec"]["command"]
            assert api.get(f"runs/{name}").json()["spec"]["command"] == command
            on_disk = yaml.safe_load((team / "runs" / name / "spec.yaml").read_text())
            assert on_disk["command"] == command
        left = sorted(p.name for p in (team / "runs").iterdir() if p.name.startswith(("race-", ".")))
        assert left == names   # no loser's folder, nor a temporary one, left behind
        assert _audit(api, "submit") == Counter({name: 1 for name in names})


def test_concurrent_updates_of_one_run_lose_no_change(racer: ServerProcess) -> None:
    """Each round changes priority and max_retries from two clients at once: both are acknowledged, so
    both must be stored (a read-modify-write outside one transaction kept one of them)."""
    with racer.client("alice") as api:
        assert api.post("runs", json={"spec": {"name": "patched", "command": "true"}}).status_code == 201
        for priority, retries in (("high", 1), ("low", 2), ("normal", 3), ("high", 4), ("low", 5)):
            answers = _at_once([lambda api, p=priority: api.patch("runs/patched", json={"priority": p}),
                                lambda api, r=retries: api.patch("runs/patched", json={"max_retries": r})], api)
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            scheduling = api.get("runs/patched").json()["spec"]["scheduling"]
            assert (scheduling["priority"], scheduling["max_retries"]) == (priority, retries)
            on_disk = yaml.safe_load((racer.home / "teams" / "red" / "runs" / "patched" / "spec.yaml").read_text())
            assert on_disk["scheduling"] == scheduling
        removed = _at_once([lambda api: api.delete("runs/patched")] * 4, api)
        assert sorted(a.status_code for a in removed) == [204, 404, 404, 404], [a.text for a in removed]
        assert _audit(api, "delete")["patched"] == 1 and _audit(api, "update")["patched"] == 10


def test_same_cluster_name_one_winner(racer: ServerProcess) -> None:
    with racer.client("alice") as api:
        answers = _at_once([lambda api: api.post("clusters", json={"name": "box", "type": "local"})] * 4, api)
        assert sorted(a.status_code for a in answers) == [201, 400, 400, 400], [a.text for a in answers]
        for lost in (a for a in answers if a.status_code == 400):
            assert lost.json()["detail"].startswith("cluster 'box' exists"), lost.text
        assert _audit(api, "cluster add")["box"] == 1


def test_a_submission_whose_folder_fails_is_rolled_back(tmp_path: Path) -> None:
    """In process, the folder's write failing half-way (as a kill -9 would stop it): no run, and the
    next submission of the name gets a folder holding only its own files."""
    platform = Platform(tmp_path / "home")
    folder = platform.home / "runs" / "half"

    def torn() -> None:
        folder.mkdir(parents=True)
        (folder / "stale.txt").write_text("from the failed submission")
        raise OSError("No space left on device")
    now = time.time()
    record = RunRecord(new_run_id(), "half", {"name": "half"}, PENDING, "local", now, now, str(folder))
    with pytest.raises(OSError, match="No space"):
        platform.db.insert_run(record, event="run created", publish=torn)
    assert platform.db.get_run("half") is None and platform.db.count_runs() == 0
    platform.create_run({"name": "half", "command": "echo whole"}, supervise=False)
    assert sorted(p.name for p in folder.iterdir()) == ["parameters.yaml", "spec.yaml"]
    assert yaml.safe_load((folder / "spec.yaml").read_text())["command"] == "echo whole"
    platform.close()


def _stored(racer: ServerProcess, name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The secret as the team's store decrypts it with the server's key."""
    monkeypatch.setenv("TESSERA_SECRET_KEY_FILE", str(racer.home / "secret.key"))
    monkeypatch.delenv("TESSERA_SECRET_KEY", raising=False)
    url = racer.db or f"sqlite:///{racer.home / 'server.db'}"
    return SecretStore(racer.home / "teams" / "red", engine=shared_engine(url), team="red").get(name).env()


@pytest.mark.parametrize("overwrite", [False, True])
def test_same_secret_stored_as_acknowledged(racer: ServerProcess, overwrite: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"token-{'over' if overwrite else 'new'}"
    values = [f"value-{i}-" + "x" * 2000 for i in range(8)]   # long: a torn write would show
    calls = [lambda api, v=v: api.post("secrets", json={"type": "env", "name": name, "values": {"TOKEN": v},
                                                         "overwrite": overwrite}) for v in values]
    with racer.client("alice") as api:
        answers = _at_once(calls, api)
        codes = [a.status_code for a in answers]
        stored = _stored(racer, name, monkeypatch)
        if overwrite:
            assert codes == [201] * len(values), [a.text for a in answers]
            assert stored["TOKEN"] in values
        else:
            assert sorted(codes) == [201] + [409] * (len(values) - 1), [a.text for a in answers]
            assert stored == {"TOKEN": values[codes.index(201)]}
            for lost in (a for a in answers if a.status_code == 409):
                assert lost.json()["detail"].startswith(f"secret {name!r} exists"), lost.text
        assert _audit(api, "secret create")[name] == codes.count(201)
        removed = _at_once([lambda api: api.delete(f"secrets/{name}")] * 4, api)
        assert sorted(a.status_code for a in removed) == [204, 404, 404, 404], [a.text for a in removed]
        assert _audit(api, "secret remove")[name] == 1


SUBMITS = 50
KILL_AFTER = 10


def test_kill_9_during_submissions_loses_no_audit_entry(racer: ServerProcess) -> None:
    """Last in this module: it kills the module's server and starts it again on the same home."""
    acked: list[str] = []
    killed = threading.Event()
    lock = threading.Lock()
    assert racer.process is not None
    group = racer.process.pid

    def submit(i: int) -> None:
        name = f"kill-{i:02d}"
        try:
            with racer.client("alice") as api:
                answer = api.post("runs", json={"spec": {"name": name, "command": f"echo {name}"}})
        except httpx.HTTPError:
            return          # no answer: not acknowledged
        assert answer.status_code == 201, answer.text
        with lock:
            acked.append(name)
            if len(acked) == KILL_AFTER and not killed.is_set():
                killed.set()
                os.killpg(group, signal.SIGKILL)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(submit, range(SUBMITS)))
    racer.process.wait(10)
    assert killed.is_set() and KILL_AFTER <= len(acked) < SUBMITS, len(acked)
    racer.start()
    with racer.client("alice") as api:
        runs = api.get("runs", params={"limit": 1000, "q": "kill-"}).raise_for_status().json()["items"]
        listed = {r["name"] for r in runs}
        assert set(acked) <= listed
        submits = _audit(api, "submit")
        assert Counter({k: v for k, v in submits.items() if k.startswith("kill-")}) == Counter(dict.fromkeys(listed, 1))
