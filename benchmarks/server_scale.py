"""Issue 23's control plane at scale: the runs list, a long run's metrics and concurrent submissions through
the HTTP API of real `tessera server start` replicas on PostgreSQL, with a team's history in the store.

    .venv/bin/python benchmarks/server_scale.py [--runs 10000] [--points 1000000] [--big-points 100000]
        [--requests 300] [--clients 50] [--per-client 6] [--rate 10] [--baseline OLD/src]

1. PostgreSQL from scripts/postgres-up.sh; team red and its user alice (`server admin create-user`).
2. The history (server_scale_fill.py): `--runs` ended runs of 12 users on 3 clusters over 90 days, each with
   a resumption and two events, and `--points` metric points: `--big-points` in one run (hist-00000), the
   rest 1,000 per run; the runs' points interleave in batches of 100, as runs training at once report
   them. Written with bulk Core inserts straight into the store (one transaction for the runs, one per
   100,000 points), then VACUUM ANALYZE (what autovacuum does after such a load).
3. Two replicas (`--db`, one `--artifacts` folder, private homes, every other setting at its default).
   Through replica A, one client, `--requests` times each, in turn:
       first      GET /runs?limit=50
       later      GET /runs?limit=50&cursor=<the cursor after page 20>
       status     GET /runs?status=FAILED&limit=50
       user       GET /runs?user=user05&limit=50
       metrics    GET /runs/hist-00000/metrics?after=0              (its first page)
       series     every page of hist-00000's metrics, to the end     (the whole 100,000, per series)
4. `--clients` clients (asyncio, one keep-alive connection each; client k talks to replica k % 2) each
   submit `--per-client` runs (`true` on the local cluster) one after another, all clients at once: the
   latency of each POST /runs, then how long until all of them ended. Back to back, the clients keep the
   replicas saturated: a submission waits for the ones ahead of it, so its latency is about clients /
   throughput. Then the same again paced, at `--rate` runs per second in all (each client waits an
   exponential time, clients / rate on average, after each answer): the latency of a submission when the
   replicas keep up.

`--baseline OLD/src`: today's single server instead (an older checkout's src/, `git worktree add OLD
4c9037a`): one server with PostgreSQL for its accounts, the same history in its team's state.db (SQLite,
written by that version's StateDB) and the big run's metrics.jsonl; `later` is `offset=1000` (it had no
cursors) and every client submits to it.

Prints a table, then one JSON line with every figure (the last line of stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
from cryptography.fernet import Fernet
from server_api import server_proc  # the test suite's server driver, loaded once
from server_replicas_logs import percentile, replica
from server_scale_fill import history, points
from sqlalchemy import insert

from tessera.platform.api.inputs import as_spec
from tessera.platform.store import models
from tessera.platform.store.db import shared_engine, writing
from tessera.platform.store.records import ResumptionRecord, RunRecord, columns

BIG_RUN, PAGE, LATER_PAGE, FILTER_USER = "hist-00000", 50, 20, "user05"
POINTS_PER_RUN, BATCH, POINTS_PER_TRANSACTION = 1000, 100, 100_000
TERMINAL = ("COMPLETED", "FAILED", "STOPPED")


def fill_store(db: str, runs: int, total_points: int, big_points: int, seed: int = 23) -> float:
    """The history in this checkout's store (PostgreSQL); seconds it took."""
    started = time.monotonic()
    engine = shared_engine(db)
    template = as_spec({"name": "template", "command": "python train.py"}).model_dump(mode="json")
    drawn = history(runs, time.time(), seed)
    rows: dict[Any, list[dict[str, Any]]] = {models.runs: [], models.resumptions: [], models.events: []}
    for run in drawn:
        spec = {**template, "name": run["name"], "compute": {**template["compute"], "cluster": run["cluster"]}}
        folder = f"red/runs/{run['name']}"
        failed = run["status"] == "FAILED"
        record = RunRecord(run["id"], run["name"], spec, run["status"], run["cluster"], run["created"], run["ended"],
                           folder, ended=run["ended"], user=run["user"], first_error="exit status 1" if failed else None)
        rows[models.runs].append({**columns(record), "team": "red"})
        rows[models.resumptions].append(columns(ResumptionRecord(
            run["id"], 0, run["cluster"], "submit", run["status"], folder, run["created"], nodes=["node-0"],
            start=run["created"] + 5, end=run["ended"], exit_code=1 if failed else 0)))
        rows[models.events] += [{"run_id": run["id"], "team": "red", "time": t, "kind": kind, "message": f"{kind} {run['name']}"}
                                for t, kind in ((run["created"], "submitted"), (run["ended"], run["status"].lower()))]
    with writing(engine) as c:
        for table, values in rows.items():
            c.execute(insert(table), values)
    batch = []
    for values in interleaved(drawn, total_points, big_points, seed):
        batch.append(values)
        if len(batch) == POINTS_PER_TRANSACTION:
            with writing(engine) as c:
                c.execute(insert(models.metrics), batch)
            batch = []
    if batch:
        with writing(engine) as c:
            c.execute(insert(models.metrics), batch)
    with psycopg.connect(plain(db), autocommit=True) as pg:
        pg.execute("VACUUM ANALYZE")
    engine.dispose()
    return time.monotonic() - started


def interleaved(drawn: list[dict[str, Any]], total: int, big: int, seed: int) -> Any:
    """Metric point rows: `big` of the first run, POINTS_PER_RUN of each next run up to `total`, in batches
    of BATCH that interleave as if the runs trained at the same time (each run's own in step order)."""
    rng = random.Random(seed)
    counts = [big] + [POINTS_PER_RUN] * ((total - big) // POINTS_PER_RUN)
    batches = []
    for run, count in zip(drawn, counts, strict=False):
        series, n = points(count), max(1, count // BATCH)
        batches += [(k / n + rng.uniform(0, 0.5 / n), run["id"], series[k * BATCH:(k + 1) * BATCH]) for k in range(n)]
    for _, run_id, chunk in sorted(batches, key=lambda b: b[0]):
        for step, data in chunk:
            yield {"run_id": run_id, "step": step, "data": data}


def plain(db: str) -> str:
    return db.replace("postgresql+psycopg://", "postgresql://")


def fill_baseline(baseline: Path, team_home: Path, runs: int, big_points: int, env: dict[str, str]) -> float:
    """The same history in the older server's team home, written by that version (server_scale_fill.py)."""
    started = time.monotonic()
    subprocess.run([sys.executable, str(Path(__file__).with_name("server_scale_fill.py")), str(team_home),
                    str(runs), BIG_RUN, str(big_points), "23"], env={**env, "PYTHONPATH": str(baseline)},
                   check=True, timeout=1800)
    return time.monotonic() - started


def timed_gets(api: httpx.Client, path: str, count: int) -> list[float]:
    """Seconds of each of `count` GETs of `path` (after 5 unmeasured), one after another."""
    out = []
    for i in range(count + 5):
        started = time.perf_counter()
        answer = api.get(path)
        answer.raise_for_status()
        if i >= 5:
            out.append(time.perf_counter() - started)
    return out


def later_page(api: httpx.Client, baseline: bool) -> str:
    """The path of the list's page LATER_PAGE + 1 (a cursor walked to; the older server had offsets)."""
    if baseline:
        return f"runs?limit={PAGE}&offset={PAGE * LATER_PAGE}"
    cursor = None
    for _ in range(LATER_PAGE):
        cursor = api.get("runs", params={"limit": PAGE, **({"cursor": cursor} if cursor else {})}).json()["next_cursor"]
        if cursor is None:
            raise SystemExit(f"--runs must be more than {PAGE * LATER_PAGE} for a page {LATER_PAGE + 1}")
    return f"runs?limit={PAGE}&cursor={cursor}"


def metric_series(api: httpx.Client) -> tuple[float, list[float], int]:
    """(seconds to read every point of the big run, each page's seconds, points read)."""
    after, pages, got, started = 0, [], 0, time.perf_counter()
    while True:
        began = time.perf_counter()
        answer = api.get(f"runs/{BIG_RUN}/metrics", params={"after": after}).raise_for_status().json()
        pages.append(time.perf_counter() - began)
        if not answer["rows"]:
            return time.perf_counter() - started, pages, got
        got, after = got + len(answer["rows"]), answer["next"]


def reads(url: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as api:
        paths = {"first": f"runs?limit={PAGE}", "later": later_page(api, bool(args.baseline)),
                 "status": f"runs?status=FAILED&limit={PAGE}", "user": f"runs?user={FILTER_USER}&limit={PAGE}",
                 "metrics": f"runs/{BIG_RUN}/metrics?after=0"}
        for label, path in paths.items():
            count = args.metric_requests if label == "metrics" else args.requests
            out[label] = summary(timed_gets(api, path, count))
            answer = api.get(path).json()     # the older server listed `runs`, this one `items`
            out[label]["items"] = len(answer.get("rows", answer.get("items", answer.get("runs", []))))
        series = [metric_series(api) for _ in range(args.series)]
        out["series"] = {**summary([s[0] for s in series]), "points": series[0][2],
                         "pages": len(series[0][1]), "page_p50_ms": ms(statistics.median(p for s in series for p in s[1])),
                         "page_p99_ms": ms(percentile([p for s in series for p in s[1]], 99))}
    return out


def summary(seconds: list[float]) -> dict[str, Any]:
    return {"n": len(seconds), "p50_ms": ms(statistics.median(seconds)), "p99_ms": ms(percentile(seconds, 99)),
            "max_ms": ms(max(seconds))}


def ms(seconds: float) -> float:
    return round(1000 * seconds, 1)


async def submit_all(urls: list[str], key: str, args: argparse.Namespace, prefix: str, gap: float,
                     on_start: Callable[[], None]) -> tuple[list[float], list[str]]:
    """Every client submits its runs one after another, all clients at once, each `gap` seconds after its
    previous answer on average (exponential; 0: at once); (latencies, errors). `on_start` is called when the
    clients are connected and about to start (the clock of the submissions starts there)."""
    latencies: list[float] = []
    errors: list[str] = []
    gate = asyncio.Event()

    async def client(k: int) -> None:
        rng = random.Random(k)
        async with httpx.AsyncClient(base_url=urls[k % len(urls)], timeout=120,
                                     headers={"Authorization": f"Bearer {key}"}) as api:
            await api.get("health")                # the connection is open before the clock starts
            await gate.wait()
            for j in range(args.per_client):
                if gap:
                    await asyncio.sleep(rng.expovariate(1 / gap))
                spec = {"name": f"{prefix}-{k:02d}-{j:02d}", "command": "true"}
                started = time.perf_counter()
                answer = await api.post("runs", json={"spec": spec, "cluster": "local"})
                latencies.append(time.perf_counter() - started)
                if answer.status_code != 201:
                    errors.append(f"{spec['name']}: {answer.status_code} {answer.text[:200]}")

    tasks = [asyncio.create_task(client(k)) for k in range(args.clients)]
    await asyncio.sleep(2.0)
    on_start()
    gate.set()
    await asyncio.gather(*tasks)
    return latencies, errors


def cpu_seconds(pids: list[int]) -> dict[str, Any]:
    """CPU-seconds used so far: by the whole machine (every core, /proc/stat), by the replicas (`pids`), by
    each PostgreSQL process, and by this process (the clients)."""
    machine = psutil.cpu_times()
    postgres: dict[int, float] = {}
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in ("postgres", "postmaster"):
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                postgres[proc.pid] = times.user + times.system
    own = psutil.Process().cpu_times()
    return {"machine": machine.user + machine.nice + machine.system + machine.irq + machine.softirq,
            "replicas": sum(t.user + t.system for t in (psutil.Process(pid).cpu_times() for pid in pids)),
            "postgres": postgres, "clients": own.user + own.system}


def cpu_spent(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """What each part spent between two `cpu_seconds`; `other`: the rest of the machine's busy time, mostly
    the submitted runs' launchers and commands (PostgreSQL: its processes alive at the end, each from its
    own figure before, or from 0 if it started since)."""
    spent = {part: after[part] - before[part] for part in ("machine", "replicas", "clients")}
    spent["postgres"] = sum(seconds - before["postgres"].get(pid, 0.0) for pid, seconds in after["postgres"].items())
    spent["other"] = spent["machine"] - spent["replicas"] - spent["clients"] - spent["postgres"]
    return {part: round(seconds, 1) for part, seconds in spent.items()}


def submissions(urls: list[str], key: str, args: argparse.Namespace, prefix: str, rate: float,
                pids: list[int]) -> dict[str, Any]:
    """`args.clients` clients submitting `args.per_client` runs each across `urls`: back to back (rate 0),
    or at `rate` runs per second in all; then until every run ended. With the CPU-seconds each part of
    the machine spent from the first submission to the last answer."""
    start: dict[str, Any] = {}

    def on_start() -> None:   # the clients are connected: from here on, the submissions' time and CPU
        start.update(cpu=cpu_seconds(pids), time=time.monotonic())

    latencies, errors = asyncio.run(submit_all(urls, key, args, prefix, args.clients / rate if rate else 0.0,
                                               on_start))
    started = start["time"]
    submitted = time.monotonic() - started
    cpu = cpu_spent(start["cpu"], cpu_seconds(pids))
    total = args.clients * args.per_client
    with httpx.Client(base_url=urls[-1], headers={"Authorization": f"Bearer {key}"}, timeout=120) as api:
        deadline = time.monotonic() + 900
        while True:
            page = api.get("runs", params={"user": "alice", "limit": 1000}).raise_for_status().json()
            runs = [r for r in page.get("items", page.get("runs", [])) if r["name"].startswith(f"{prefix}-")]
            done = [r for r in runs if r["status"] in TERMINAL]
            if len(done) >= total - len(errors) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    return {**summary(latencies), "clients": args.clients, "replicas": len(urls), "rate": rate, "submitted": total,
            "errors": len(errors), "first_error": errors[0] if errors else None, "submit_s": round(submitted, 2),
            "all_ended_s": round(time.monotonic() - started, 2),
            "completed": sum(r["status"] == "COMPLETED" for r in done), "ended": len(done),
            "cpu_s_while_submitting": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--big-points", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=300, help="GETs per list query")
    parser.add_argument("--metric-requests", type=int, default=50, help="GETs of the metrics' first page")
    parser.add_argument("--series", type=int, default=5, help="reads of the big run's whole metrics")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--per-client", type=int, default=6)
    parser.add_argument("--rate", type=float, default=10.0,
                        help="runs per second in all of a second, paced round of submissions (0: none)")
    parser.add_argument("--baseline", type=Path, default=None, help="the src/ of an older checkout (single server)")
    args = parser.parse_args()
    proc = server_proc()
    folder = Path(tempfile.mkdtemp(prefix="tessera-scale-"))
    postgres = proc.start_postgres()
    env = {**proc.server_env(folder), "TESSERA_SECRET_KEY": Fernet.generate_key().decode()}
    env.pop("TESSERA_SUPERVISOR_POLL", None)                      # the servers' own cadence
    if args.baseline:
        args.baseline = args.baseline.resolve()
        env["PYTHONPATH"] = str(args.baseline)
    replicas: list[Any] = []
    load = [os.getloadavg()[0]]
    try:
        serve = [] if args.baseline else ["--artifacts", str(folder / "artifacts")]
        replicas = [replica(folder, n, env, postgres.url, serve) for n in ("a" if args.baseline else "ab")]
        replicas[0].add_users({"alice": "red"})
        key = replicas[0].keys["alice"]
        filled = (fill_baseline(args.baseline, folder / "home-a" / "teams" / "red", args.runs, args.big_points, env)
                  if args.baseline else fill_store(postgres.url, args.runs, args.points, args.big_points))
        for server in replicas:
            server.start()
        load.append(os.getloadavg()[0])
        urls = [f"{r.url}/api/v1/" for r in replicas]
        figures = reads(urls[0], key, args)
        pids = [server.process.pid for server in replicas]
        figures["submit"] = submissions(urls, key, args, "sub", 0.0, pids)
        if args.rate:
            figures["paced"] = submissions(urls, key, args, "pace", args.rate, pids)
        load.append(os.getloadavg()[0])
    finally:
        for server in replicas:
            server.stop()
        if args.baseline:
            subprocess.run([sys.executable, "-c", "import sys; from tessera.platform.supervision.supervisor import "
                            "stop_supervisor; stop_supervisor(sys.argv[1])", str(folder / "home-a" / "teams" / "red")],
                           env=env, timeout=60)
        postgres.stop()
        shutil.rmtree(folder, ignore_errors=True)
    report(args, filled, figures, load)


def report(args: argparse.Namespace, filled: float, figures: dict[str, Any], load: list[float]) -> None:
    code = f"single server of {args.baseline}" if args.baseline else "this checkout, 2 replicas"
    print(f"{code}: {args.runs:,} runs, {args.points if not args.baseline else args.big_points:,} metric points "
          f"(filled in {filled:.0f} s), load average {' / '.join(f'{x:.1f}' for x in load)}")
    header = f"{'query':<9} | {'n':>5} | {'items':>6} | {'p50 ms':>8} | {'p99 ms':>8} | {'max ms':>8}"
    print(header)
    print("-" * len(header))
    for label in ("first", "later", "status", "user", "metrics", "series"):
        row = figures[label]
        print(f"{label:<9} | {row['n']:>5} | {row.get('items', row.get('points', '')):>6} | {row['p50_ms']:>8} | "
              f"{row['p99_ms']:>8} | {row['max_ms']:>8}")
    series = figures["series"]
    print(f"metrics series: {series['pages']} pages, page p50 {series['page_p50_ms']} ms, p99 {series['page_p99_ms']} ms")
    for sub in (figures["submit"], figures.get("paced")):
        if sub:
            pace = f"at {sub['rate']:g} runs/s" if sub["rate"] else "back to back"
            print(f"submit {pace}: {sub['submitted']} runs by {sub['clients']} clients over {sub['replicas']} "
                  f"replica(s): p50 {sub['p50_ms']} ms, p99 {sub['p99_ms']} ms, max {sub['max_ms']} ms, {sub['errors']} "
                  f"errors; all answered in {sub['submit_s']} s, {sub['ended']} ended ({sub['completed']} "
                  f"completed) after {sub['all_ended_s']} s")
            cpu = sub["cpu_s_while_submitting"]
            print(f"  CPU-seconds while submitting ({sub['submit_s']} s on {os.cpu_count()} cores): " +
                  ", ".join(f"{part} {seconds}" for part, seconds in cpu.items()))
    print(json.dumps({"benchmark": "server_scale", "code": code, "runs": args.runs, "points": args.points,
                      "big_points": args.big_points, "fill_s": round(filled, 1), "loadavg": load, **figures}))


if __name__ == "__main__":
    main()
