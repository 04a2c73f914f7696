"""The control-plane server's API under load: requests per second and latency (p50/p99) of the runs list,
describe, logs and metrics with 10,000 runs in a team's database, and the wall time of 200 runs submitted
at once by 4 users of 2 teams.

    .venv/bin/python benchmarks/server_api.py [--runs 10000] [--clients 8] [--seconds 5] [--load-runs 200]

1. Team red gets `--runs` finished run records written straight into the
   server's store before the server starts (no supervisor: they are history), each with one
   resumption and two events, as real finished runs have; their users are hist1..hist4. Then a real
   `tessera server start` (uvicorn, SQLite server database) serves them, alice (team red) submits one
   real run that prints 2,000 log lines and 500 metric rows, and each endpoint is called for `--seconds`
   by 1 client and then by `--clients` concurrent clients (threads, one httpx client each, keep-alive):

       list       GET /runs?status=COMPLETED,FAILED&user=hist1&limit=50&cursor=<one of the first 20 pages>
       describe   GET /runs/<a random one of the 10,000>
       logs       GET /runs/<the real run>/logs (follow=0: 2,000 lines)
       metrics    GET /runs/<the real run>/metrics?after=0 (500 rows)

   The same list page, describe and logs through the local SDK (`Platform.run_page`,
   `describe_run`, `follow_logs(follow=False)` on the same home, in this process, no HTTP) are the
   reference: there is no runnable anchor for the server itself (SkyPilot's
   API server and MosaicML's control plane cannot be installed here offline as servers).
2. `--load-runs` runs (spread over alice and carol of team red, bob and dave of team blue) are submitted
   at once from 8 threads into the same server: seconds until all were accepted, and until all had ended.

Prints a table, then one JSON line with every figure (the last line of stdout).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import insert
from tests_shared import TESTS

from tessera.platform.api.inputs import as_spec
from tessera.platform.api.sdk import Platform
from tessera.platform.home import private_dir
from tessera.platform.store import models
from tessera.platform.store.db import shared_engine, writing
from tessera.platform.store.records import ResumptionRecord, RunRecord, columns
from tessera.platform.supervision.supervisor import stop_supervisor

HIST_USERS = ("hist1", "hist2", "hist3", "hist4")
STATUSES = ("COMPLETED", "COMPLETED", "COMPLETED", "FAILED", "STOPPED")
PAGES = 20
LOG_LINES, METRIC_ROWS = 2000, 500


def server_proc() -> Any:
    """tests/server/server_proc.py (the test suite's server driver), loaded by file: one copy of it."""
    import importlib.util

    if "server_proc" not in sys.modules:
        spec = importlib.util.spec_from_file_location("server_proc", TESTS / "server" / "server_proc.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["server_proc"] = module
        spec.loader.exec_module(module)
    return sys.modules["server_proc"]


def server_store(server_home: Path) -> Any:
    """The engine of the server's store (its default database: SQLite in its home)."""
    return shared_engine(f"sqlite:///{private_dir(server_home) / 'server.db'}")


def fill_history(server_home: Path, runs: int) -> list[str]:
    """Write `runs` finished runs (one resumption, two events each) of team red into the server's store,
    in one transaction; returns their names."""
    spec = as_spec({"name": "template", "command": "python train.py"}).model_dump(mode="json")
    spec["compute"]["cluster"] = "local"
    names, now = [], time.time() - runs
    rows: dict[Any, list[dict[str, Any]]] = {models.runs: [], models.resumptions: [], models.events: []}
    folder = server_home / "teams" / "red" / "runs"
    for i in range(runs):
        name, run_id, created = f"hist-{i:05d}", uuid.uuid4().hex[:12], now + i
        status = STATUSES[i % len(STATUSES)]
        record = RunRecord(run_id, name, {**spec, "name": name}, status, "local", created, created + 60,
                           str(folder / name), ended=created + 60, user=HIST_USERS[i % 4],
                           first_error="exit status 1" if status == "FAILED" else None)
        rows[models.runs].append({**columns(record), "team": "red"})
        rows[models.resumptions].append(columns(ResumptionRecord(
            run_id, 0, "local", "submit", status, record.folder, created, nodes=["localhost"], start=created + 1,
            end=created + 60, exit_code=1 if status == "FAILED" else 0)))
        rows[models.events] += [{"run_id": run_id, "team": "red", "time": created + t, "kind": kind,
                                 "message": f"{kind} {name}"} for t, kind in ((0, "submitted"), (60, status.lower()))]
        names.append(name)
    with writing(server_store(server_home)) as c:
        for table, values in rows.items():
            c.execute(insert(table), values)
    return names


def real_run_spec() -> dict[str, Any]:
    """A run that prints LOG_LINES lines and reports METRIC_ROWS rows to $TESSERA_METRICS (the script
    goes through base64 so the command line needs no quoting)."""
    script = (f"import json, os\nfor i in range({LOG_LINES}): print(f'step {{i}} loss {{1 / (i + 1):.4f}}')\n"
              f"with open(os.environ['TESSERA_METRICS'], 'a') as out:\n"
              f"    for i in range({METRIC_ROWS}): out.write(json.dumps({{'step': i, 'loss/train': 1 / (i + 1), "
              f"'lr': 1e-3, 'throughput/tokens_per_sec': 1000.0, 'throughput/mfu': 0.4}}) + '\\n')\n")
    encoded = base64.b64encode(script.encode()).decode()
    return {"name": "bench-real", "command": f"echo {encoded} | base64 -d | {sys.executable} -"}


def percentiles(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


def hammer(server: Any, path_of: Any, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` threads call GET path_of(rng) for `seconds`; requests/s, p50/p99 ms, non-200 answers."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    bad: list[int] = []
    stop_at = time.monotonic() + seconds

    def worker(k: int) -> None:
        rng = random.Random(k)
        with server.client("alice") as api:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                answer = api.get(path_of(rng))
                _ = answer.content
                latencies[k].append(time.perf_counter() - started)
                if answer.status_code != 200:
                    bad.append(answer.status_code)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    every = [x for per in latencies for x in per]
    p50, p99 = percentiles(every)
    return {"clients": clients, "requests": len(every), "rps": len(every) / wall, "p50_ms": p50, "p99_ms": p99,
            "errors": len(bad)}


def page_cursors(platform: Platform) -> list[str | None]:
    """The cursors of the first PAGES pages of the listed query (the first page's is None)."""
    cursors: list[str | None] = [None]
    while len(cursors) < PAGES:
        cursors.append(platform.run_page(("COMPLETED", "FAILED"), user="hist1", cursor=cursors[-1], limit=50)
                       .next_cursor)
    return cursors


def sdk_rows(team_home: Path, seconds: float, names: list[str]) -> dict[str, dict[str, Any]]:
    """The list page and the logs through the local SDK on the same home (in this process, one thread,
    no HTTP): what the API adds is the difference."""
    platform = Platform(team_home, engine=server_store(team_home.parent.parent), team="red")
    rng = random.Random(0)
    cursors = page_cursors(platform)

    def list_page() -> None:
        page = platform.run_page(("COMPLETED", "FAILED"), user="hist1", cursor=rng.choice(cursors), limit=50)
        assert len(page.items) == 50

    calls = {"list (local SDK)": list_page,
             "describe (local SDK)": lambda: platform.describe_run(rng.choice(names)),
             "logs (local SDK)": lambda: list(platform.follow_logs("bench-real", follow=False))}
    out = {}
    try:
        for label, call in calls.items():
            latencies, stop_at = [], time.monotonic() + seconds
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                call()
                latencies.append(time.perf_counter() - started)
            p50, p99 = percentiles(latencies)
            out[label] = {"clients": 1, "requests": len(latencies), "rps": len(latencies) / seconds, "p50_ms": p50,
                          "p99_ms": p99, "errors": 0}
    finally:
        platform.close()
    return out


def measure_api(server: Any, names: list[str], args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    paths = {
        "list": lambda rng: f"runs?status=COMPLETED,FAILED&user=hist1&limit=50&cursor={rng.choice(cursors) or ''}",
        "describe": lambda rng: f"runs/{rng.choice(names)}",
        "logs": lambda rng: "runs/bench-real/logs?follow=0",
        "metrics": lambda rng: "runs/bench-real/metrics?after=0",
    }
    sdk = sdk_rows(server.home / "teams" / "red", args.seconds, names)
    platform = Platform(server.home / "teams" / "red")
    try:
        cursors = page_cursors(platform)
    finally:
        platform.close()
    results: dict[str, list[dict[str, Any]]] = {}
    for endpoint, path_of in paths.items():
        if f"{endpoint} (local SDK)" in sdk:
            results[f"{endpoint} (local SDK)"] = [sdk[f"{endpoint} (local SDK)"]]
        results[endpoint] = [hammer(server, path_of, clients, args.seconds) for clients in (1, args.clients)]
    return results


def measure_load(server: Any, sp: Any, total: int) -> dict[str, Any]:
    """Seconds to submit `total` runs at once (4 users, 8 threads) and until all have ended."""
    started = time.monotonic()
    load = sp.submit_load(server, ["alice", "carol", "bob", "dave"], total)
    if load.errors:
        raise RuntimeError(f"{len(load.errors)} submissions failed, e.g. {load.errors[0]}")
    ended = {user: sp.wait_all_done(server, user, total // 4, timeout=1800) for user in load.names}
    done_s = time.monotonic() - started
    statuses = [r["status"] for runs in ended.values() for r in runs if r["name"].startswith("load-")]
    return {"runs": total, "submit_s": load.seconds, "all_ended_s": done_s,
            "completed": statuses.count("COMPLETED"), "failed": statuses.count("FAILED"),
            "lost": total - len(statuses)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="finished runs in team red's database")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients in the second round")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per endpoint and round")
    parser.add_argument("--load-runs", type=int, default=200, help="runs submitted at once by 4 users (0: skip)")
    args = parser.parse_args()
    sp = server_proc()
    folder = Path(tempfile.mkdtemp(prefix="tessera-server-bench-"))
    server = sp.ServerProcess(folder, folder / "server-home", sp.server_env(folder))
    load_before = os.getloadavg()[0]
    try:
        filled = time.monotonic()
        names = fill_history(server.home, args.runs)
        filled = time.monotonic() - filled
        server.start()
        server.add_users({"alice": "red", "carol": "red", "bob": "blue", "dave": "blue"})
        with server.client("alice") as api:
            api.post("runs", json={"spec": real_run_spec()}).raise_for_status()
        real = next(r for r in sp.wait_all_done(server, "alice", 1, timeout=300) if r["name"] == "bench-real")
        if real["status"] != "COMPLETED":
            raise RuntimeError(f"the benchmark's own run ended {real['status']}:\n{server.tail()}")
        results = measure_api(server, names, args)
        load = measure_load(server, sp, args.load_runs) if args.load_runs else None
    finally:
        server.stop()
        for team_home in (server.home / "teams").glob("*"):
            stop_supervisor(team_home)
        shutil.rmtree(folder, ignore_errors=True)
    report(args, filled, results, load, (load_before, os.getloadavg()[0]))


def report(args: argparse.Namespace, filled: float, results: dict[str, list[dict[str, Any]]],
           load: dict[str, Any] | None, loadavg: tuple[float, float]) -> None:
    print(f"server API: {args.runs:,} finished runs of team red in the server's store (written in {filled:.1f} s), "
          f"{args.seconds:g} s per row, load average {loadavg[0]:.1f} before, {loadavg[1]:.1f} after")
    header = f"{'endpoint':<20} | {'clients':>7} | {'requests':>8} | {'req/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | errors"
    print(header)
    print("-" * len(header))
    for endpoint, rows in results.items():
        for r in rows:
            print(f"{endpoint:<20} | {r['clients']:>7} | {r['requests']:>8} | {r['rps']:>7.1f} | {r['p50_ms']:>7.1f} | "
                  f"{r['p99_ms']:>7.1f} | {r['errors']}")
    if load:
        print(f"\n{load['runs']} runs by 4 users of 2 teams at once: all accepted in {load['submit_s']:.1f} s, all "
              f"ended in {load['all_ended_s']:.1f} s ({load['completed']} completed, {load['failed']} failed, "
              f"{load['lost']} lost)")
    print(json.dumps({"benchmark": "server_api", "runs_in_db": args.runs, "seconds": args.seconds,
                      "results": results, "load": load,
                      "loadavg": loadavg}))


if __name__ == "__main__":
    main()
