"""Issue 23's check, as it is written: PostgreSQL on 127.0.0.1 (scripts/postgres-up.sh), team red and user
alice made by `tessera server admin create-user alice --team red --db URL`, two real replicas
`tessera server start --host 127.0.0.1 --port P --db URL --home HOME_A|HOME_B --artifacts ART` with
private homes and one shared artifacts folder, and everything else through /api/v1:

1. same-name race: 8 names x 6 concurrent submissions spread over both replicas, each with another command:
   per name one 201 and five 409, and both replicas show the winner's command;
2. 40 distinct runs submitted concurrently across both: each acknowledged run listed by both replicas, none
   twice, each with exactly one audit 'submit' entry;
3. all of them COMPLETED as seen from both replicas, the log of each read through the replica that did not
   accept it; a run shows RUNNING while its command runs;
4. replica loss: 30 concurrent submissions to A, `kill -9` of A's process group after 10 acknowledgements;
   B answers without a 5xx, lists every run A acknowledged and drives them all to COMPLETED while A is down;
   A started again lists the same set.
(Point 5, the OpenAPI document, is checked by the typed API's own tests.)

The replicas share the secrets key (TESSERA_SECRET_KEY, as a deployment gives it to each) and lease runs
for 3 s (`--lease-seconds 3`), so B takes A's runs over 3 s after A dies rather than 30.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet
from server_proc import SERVER_CLI, Postgres, fresh_database, server_env
from sqlalchemy import insert
from typer.testing import CliRunner

from tessera.cli.server import app as server_cli
from tessera.platform.api.sdk import Platform
from tessera.platform.clusters.base import hostname
from tessera.platform.clusters.local import free_port
from tessera.platform.store.leases import Replica as LeaseReplica
from tessera.platform.store.leases import boot_id, lease_of
from tessera.platform.store.models import run_leases
from tessera.platform.store.records import ResumptionRecord
from tessera.platform.supervision.context import SupervisorSettings
from tessera.platform.supervision.leased import Supervision

TERMINAL = ("COMPLETED", "FAILED", "STOPPED")
DONE_WITHIN = 240.0
LEASE = "3"


@dataclass
class Replica:
    """One `tessera server start` of the pair; `start` may be called again (same home, same port)."""
    name: str
    home: Path
    port: int
    args: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1/"

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([*SERVER_CLI, "start", "--host", "127.0.0.1", "--port", str(self.port),
                                             "--home", str(self.home), *self.args], stdout=out,
                                            stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def wait_up(self, timeout: float = 60.0) -> str:
        """The replica id /health names, once it answers."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                answer = httpx.get(f"{self.url}health", timeout=2)
                if answer.status_code == 200:
                    return answer.json()["replica"]
            except httpx.TransportError:
                pass
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"replica {self.name} did not start:\n{self.tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""


@dataclass
class Pair:
    a: Replica
    b: Replica
    key: str
    art: Path

    def client(self, replica: Replica, connections: int = 20) -> httpx.Client:
        return httpx.Client(base_url=replica.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=60,
                            limits=httpx.Limits(max_connections=connections))


@pytest.fixture(scope="module")
def postgres(postgres_cluster: Postgres) -> Postgres:
    return fresh_database(postgres_cluster, "replicas")


@pytest.fixture(scope="module")
def pair(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    folder = tmp_path_factory.mktemp("replicas")
    env = {**server_env(folder), "TESSERA_SECRET_KEY": Fernet.generate_key().decode()}
    made = subprocess.run([*SERVER_CLI, "admin", "create-user", "alice", "--team", "red", "--db", postgres.url],
                          capture_output=True, text=True, env=env, timeout=120)
    assert made.returncode == 0, made.stderr
    art = folder / "artifacts"
    args = ["--db", postgres.url, "--artifacts", str(art), "--lease-seconds", LEASE, "--log-level", "warning"]
    a, b = (Replica(n, folder / f"home-{n}", free_port(), args, env, folder / f"replica-{n}.log") for n in "ab")
    try:
        a.start()
        b.start()
        assert a.wait_up() != b.wait_up()          # two replicas, each naming itself
        yield Pair(a, b, made.stdout.strip(), art)
    finally:
        a.stop()
        b.stop()


def _at_once(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Each call from its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], httpx.Response]) -> httpx.Response:
        barrier.wait()
        return call()
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _all_pages(api: httpx.Client, path: str, **params: object) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    cursor = None
    while True:
        page = api.get(path, params={**params, "limit": 100, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        items += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return items


def _wait_completed(api: httpx.Client, names: set[str], replica: Replica) -> dict[str, dict[str, object]]:
    """The runs named (listed by `replica`) once every one has ended; they must all be COMPLETED."""
    deadline = time.monotonic() + DONE_WITHIN
    while True:
        runs = {r["name"]: r for r in _all_pages(api, "runs") if r["name"] in names}
        if len(runs) == len(names) and all(r["status"] in TERMINAL for r in runs.values()):
            assert {n: r["status"] for n, r in runs.items()} == dict.fromkeys(names, "COMPLETED")
            return runs
        if time.monotonic() > deadline:
            waiting = sorted(f"{n}={r['status']}" for n, r in runs.items() if r["status"] not in TERMINAL)
            raise AssertionError(f"after {DONE_WITHIN} s, {len(runs)}/{len(names)} listed, active: {waiting[:10]}\n"
                                 f"{replica.tail()}")
        time.sleep(0.3)


def test_1_same_name_race_across_replicas(pair: Pair) -> None:
    names = [f"race-{n}" for n in range(8)]
    with pair.client(pair.a, 50) as on_a, pair.client(pair.b, 50) as on_b:
        apis = (on_a, on_b)
        calls = [lambda name=name, i=i: apis[i % 2].post("runs", json={"spec": {"name": name, "command": f"echo {name} by {i}"}})
                 for name in names for i in range(6)]
        answers = _at_once(calls)
        for n, name in enumerate(names):
            mine = answers[n * 6:(n + 1) * 6]
            assert sorted(a.status_code for a in mine) == [201] + [409] * 5, [a.text for a in mine]
            for lost in (a for a in mine if a.status_code == 409):
                assert lost.json()["detail"].startswith(f"a run named {name!r} exists"), lost.text
            command = next(a.json() for a in mine if a.status_code == 201)["spec"]["command"]
            assert [api.get(f"runs/{name}").json()["spec"]["command"] for api in apis] == [command, command]


def test_2_and_3_distinct_runs_listed_audited_completed_and_logged_across(pair: Pair) -> None:
    names = [f"many-{i:02d}" for i in range(40)]
    with pair.client(pair.a) as on_a, pair.client(pair.b) as on_b:
        apis = (on_a, on_b)
        accepted_by = {name: i % 2 for i, name in enumerate(names)}
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda name: apis[accepted_by[name]].post(
                "runs", json={"spec": {"name": name, "command": f"echo {name} says hello"}}), names))
        assert [a.status_code for a in answers] == [201] * 40, [a.text for a in answers if a.status_code != 201]
        for api in apis:                                       # 2: listed by both, once each, one 'submit' each
            listed = [r["name"] for r in _all_pages(api, "runs", q="many-")]
            assert sorted(listed) == names
            submits = Counter(e["target"] for e in _all_pages(api, "audit", action="submit"))
            assert {n: submits[n] for n in names} == dict.fromkeys(names, 1)

        # 3: a run is RUNNING while its command runs (it waits for a file), as either replica sees it
        gate = pair.art.parent / "gate"
        assert on_a.post("runs", json={"spec": {"name": "gated", "command": f"until [ -e {gate} ]; do sleep 0.1; "
                                                  "done; echo released"}}).status_code == 201
        deadline = time.monotonic() + DONE_WITHIN
        while not all(api.get("runs/gated").json()["status"] == "RUNNING" for api in apis):
            assert time.monotonic() < deadline, pair.a.tail()
            time.sleep(0.1)
        described = on_b.get("runs/gated").json()
        assert described["resumptions"][-1]["status"] == "RUNNING" and described["supervisor"]["replica"]
        gate.touch()
        for api, replica in ((on_a, pair.a), (on_b, pair.b)):
            _wait_completed(api, {*names, "gated"}, replica)
        for name in names:                                     # each log read through the other replica
            other = apis[1 - accepted_by[name]]
            log = other.get(f"runs/{name}/logs")
            assert (log.status_code, log.text) == (200, f"{name} says hello\n"), (name, log.text)


def test_4_replica_loss_b_takes_over_and_a_comes_back(pair: Pair) -> None:
    names = [f"loss-{i:02d}" for i in range(30)]
    acked: list[str] = []
    killed = threading.Event()
    lock = threading.Lock()
    assert pair.a.process is not None
    group = pair.a.process.pid

    def submit(name: str) -> None:
        try:
            with pair.client(pair.a, 1) as api:
                answer = api.post("runs", json={"spec": {"name": name, "command": f"sleep 1; echo {name} ok"}})
        except httpx.HTTPError:
            return                                             # no answer: not acknowledged
        assert answer.status_code == 201, answer.text
        with lock:
            acked.append(name)
            if len(acked) == 10 and not killed.is_set():
                killed.set()
                os.killpg(group, signal.SIGKILL)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(submit, names))
    pair.a.process.wait(10)
    assert killed.is_set() and 10 <= len(acked) < 30, len(acked)

    codes: list[int] = []
    with pair.client(pair.b) as on_b:
        deadline = time.monotonic() + DONE_WITHIN
        while True:                                            # B answers throughout, never a 5xx
            page = on_b.get("runs", params={"q": "loss-", "limit": 100})
            codes.append(page.status_code)
            assert page.status_code == 200, page.text
            runs = {r["name"]: r["status"] for r in page.json()["items"]}
            assert set(acked) <= set(runs)                     # every run A acknowledged
            if all(runs[n] in TERMINAL for n in acked):
                break
            assert time.monotonic() < deadline, pair.b.tail()
            time.sleep(0.3)
        assert {n: runs[n] for n in acked} == dict.fromkeys(acked, "COMPLETED")
        assert all(code < 500 for code in codes)
        described = {n: on_b.get(f"runs/{n}").json() for n in acked}
        assert any("took over" in e["message"] for d in described.values() for e in d["events"])
        # A's processes outlived it on this host: B reattached to them, so each run ran exactly once
        assert {n: [r["status"] for r in d["resumptions"]] for n, d in described.items()} == \
            dict.fromkeys(acked, ["COMPLETED"])
        assert {n: on_b.get(f"runs/{n}/logs").text for n in acked} == {n: f"{n} ok\n" for n in acked}
        seen_by_b = {r["name"] for r in _all_pages(on_b, "runs", q="loss-")}
    pair.a.start()
    pair.a.wait_up()
    with pair.client(pair.a) as on_a:
        assert {r["name"] for r in _all_pages(on_a, "runs", q="loss-")} == seen_by_b


def test_a_replica_with_another_secrets_key_refuses_to_start(pair: Pair, postgres: Postgres, tmp_path: Path) -> None:
    other = Fernet.generate_key().decode()
    refused = CliRunner().invoke(server_cli, ["start", "--port", str(free_port()), "--db", postgres.url,
                                              "--home", str(tmp_path / "home-c")], env={"TESSERA_SECRET_KEY": other})
    assert refused.exit_code == 1, refused.output
    [line] = refused.output.strip().splitlines()
    assert line.startswith("error: cannot start the server: the secrets key (TESSERA_SECRET_KEY, fingerprint "), line
    assert "is not the key of this store's secrets" in line and other not in line


@pytest.mark.parametrize("host", ["here", "elsewhere"])
def test_a_run_whose_processes_died_with_their_replica_resumes_saying_so(tmp_path: Path, host: str) -> None:
    """In process, on SQLite: replica 'ghost' held the lease of a RUNNING run and died with the run's
    processes (the handle's pid is dead, with no exit file), on this host or on another one this replica
    cannot reach (its local processes are not asked about). Once the lease has expired, the next pass of
    another replica ends that resumption as lost and starts the next one, whose cause names the ghost."""
    home = tmp_path / "home"
    platform = Platform(home, supervise=lambda: None)
    run = platform.create_run({"name": "orphan", "command": "echo resumed"})
    folder = Path(run.folder) / "r0"
    folder.mkdir(parents=True)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    nodes = [hostname()] if host == "here" else ["elsewhere"]
    handle = {"job_id": "lost", "pid": pid_max + 1, "ticks": 0, "folder": str(folder), "nodes": nodes,
              "boot_id": boot_id()}
    now = time.time()
    platform.db.add_resumption(ResumptionRecord(run.id, 0, "local", "submitted", "RUNNING", str(folder), now - 5,
                                                job_id="lost", handle=handle, nodes=nodes, start=now - 5))
    platform.db.update_run(run.id, status="RUNNING")
    with platform.db.engine.begin() as c:
        c.execute(insert(run_leases).values(run_id=run.id, owner="ghost", token=4, heartbeat=now - 60,
                                            expires=now - 30))
    settings = SupervisorSettings(poll=0.1, lease_seconds=30)
    supervision = Supervision(platform.db.engine, LeaseReplica("b"), lambda _team: home, settings)
    deadline = time.monotonic() + 60
    while platform.get_run("orphan").status != "COMPLETED":
        supervision.tick()
        assert time.monotonic() < deadline, platform.describe_run("orphan")
        time.sleep(0.1)
    lost, resumed = platform.get_run("orphan").resumptions
    assert (lost.status, lost.outcome, resumed.status) == ("LOST", "supervisor_lost", "COMPLETED")
    assert lost.detail == ("the processes ended with their supervisor, replica ghost" if host == "here" else
                           "the processes ran where replica b cannot reach them (host elsewhere)")
    assert resumed.cause == "its supervisor, replica ghost, was lost; resumed from the last checkpoint"
    assert platform.get_run("orphan").retries_used == 0 and lease_of(platform.db.engine, run.id)[0] == "b"
    supervision.tick()                                         # the next pass releases the ended run's lease
    assert lease_of(platform.db.engine, run.id) is None
