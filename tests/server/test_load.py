"""Load: 200 runs submitted at once by 4 users of 2 teams through a real server's API (8 threads), while
someone keeps reading the runs list. Every request is answered (no 5xx, no dropped connection), every run
ends COMPLETED, or FAILED for its own reason (each tenth run exits 3 on purpose), and nothing is lost or
doubled: each user's list holds exactly the runs that user submitted, and each team's only its own.

200 runs took ~16 s from the first submission to the last run's end on this 2-core machine, under a load
average of 7 (benchmarks/RESULTS.md, "Control-plane server"), so the test runs the issue's full 200."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from server_proc import ServerProcess, load_spec, served, submit_load, wait_all_done

RUNS = 200
FAIL_EVERY = 10
TEAMS = {"alice": "red", "carol": "red", "bob": "blue", "dave": "blue"}


@pytest.fixture(scope="module")
def load_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(tmp_path_factory.mktemp("load"), TEAMS) as server:
        yield server


def read_while(server: ServerProcess, done: threading.Event, codes: list[int]) -> None:
    """bob lists his team's runs and reads the newest one until `done`: reads beside the writes."""
    with server.client("bob") as api:
        while not done.is_set():
            try:
                page = api.get("runs", params={"limit": 50})
                codes.append(page.status_code)
                if page.status_code == 200 and page.json()["items"]:
                    codes.append(api.get(f"runs/{page.json()['items'][0]['name']}").status_code)
            except httpx.HTTPError:
                codes.append(0)   # no answer
            done.wait(0.05)


def test_200_concurrent_runs_of_4_users_end_cleanly_with_nothing_lost(load_server: ServerProcess) -> None:
    done, read_codes = threading.Event(), []
    reader = threading.Thread(target=read_while, args=(load_server, done, read_codes))
    reader.start()
    try:
        load = submit_load(load_server, list(TEAMS), RUNS, threads=8, fail_every=FAIL_EVERY)
    finally:
        done.set()
        reader.join()
    assert load.errors == [] and load.codes == [201] * RUNS
    assert read_codes and set(read_codes) == {200}

    per_user = RUNS // len(TEAMS)
    for user in TEAMS:
        expected = {load_spec(user, i, FAIL_EVERY)["name"] for i in range(per_user)}
        failing = {load_spec(user, i, FAIL_EVERY)["name"] for i in range(per_user)
                   if "exit 3" in load_spec(user, i, FAIL_EVERY)["command"]}
        runs = wait_all_done(load_server, user, per_user, timeout=120)
        names = [r["name"] for r in runs]
        assert len(names) == len(set(names)) == per_user and set(names) == expected == set(load.names[user])
        assert {r["user"] for r in runs} == {user}
        assert {r["name"] for r in runs if r["status"] == "FAILED"} == failing
        assert {r["status"] for r in runs} == {"COMPLETED", "FAILED"}
    with load_server.client("alice") as alice, load_server.client("dave") as dave:
        red = alice.get("runs", params={"limit": RUNS}).json()
        assert red["total"] == RUNS // 2 and {r["user"] for r in red["items"]} == {"alice", "carol"}
        assert dave.get("runs", params={"limit": 1}).json()["total"] == RUNS // 2
        assert dave.get(f"runs/{red['items'][0]['name']}").status_code == 404
        failed = alice.get(f"runs/{load_spec('alice', FAIL_EVERY - 1, FAIL_EVERY)['name']}").json()
        assert failed["status"] == "FAILED" and failed["first_error"], failed
        assert "\n" not in failed["first_error"].strip() and "Traceback" not in failed["first_error"]
        assert "fails" in alice.get(f"runs/{failed['name']}/logs").text
