"""Issue 23's log latency across replicas: a line a run prints, seen by a client that follows the run's log
through the other replica (target: p99 < 1 s).

    .venv/bin/python benchmarks/server_replicas_logs.py [--db postgres|sqlite] [--lines 300]
        [--interval 0.1] [--poll SECONDS]

Two real `tessera server start` replicas (private homes, one database: PostgreSQL from
scripts/postgres-up.sh, or one SQLite file; one artifacts folder) serve team red; alice submits a run to
replica A that prints `--lines` lines, one every `--interval` s (jittered by up to half of it, so lines
do not fall in step with the supervision's passes), each carrying the time it was printed. Whichever
replica holds the run's lease ships its log to the artifacts folder; the client follows it with
`GET /runs/NAME/logs?follow=1` (server-sent events) through replica B, and the latency of a line is when
B's event arrives minus when the run printed it (one host, one clock). Both replicas run with the
environment's supervision poll (`--poll` sets TESSERA_SUPERVISOR_POLL for them; by default the server's
own default).

`--single`: one replica only, followed through itself. `--baseline OLD/src`: the single server of an older
checkout (run with PYTHONPATH=OLD/src; `git worktree add OLD <commit>`), for comparison.

Prints the figures, then one JSON line with them (the last line of stdout).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from cryptography.fernet import Fernet
from server_api import server_proc  # the test suite's server driver, loaded once

PRINTER = """
import random, sys, time
lines, interval = int(sys.argv[1]), float(sys.argv[2])
time.sleep(1.0)                       # the follower is connected before the first line
for i in range(lines):
    print(f"line {i} {time.time():.6f}", flush=True)
    time.sleep(interval * random.uniform(0.5, 1.5))
"""


def replica(folder: Path, name: str, env: dict[str, str], db: str, args: list[str]) -> Any:
    """One replica, not started yet: the test suite's ServerProcess (tests/server/server_proc.py) with a
    private home in `folder`, the shared database `db`, `args` more options and uvicorn's warnings only (no
    line per request). `start()` starts it on a free port and waits for /health; again after a kill."""
    return server_proc().ServerProcess(folder, folder / f"home-{name}", env, db=db,
                                       args=[*args, "--log-level", "warning"])


def replica_id(server: Any) -> str | None:
    """The replica id /health names (None from an older single server, which names none)."""
    return httpx.get(f"{server.url}/api/v1/health", timeout=10).raise_for_status().json().get("replica")


def follow(url: str, key: str, name: str) -> list[float]:
    """Latency of each line of the run's log, followed as server-sent events through `url`."""
    latencies: list[float] = []
    with httpx.stream("GET", url + f"runs/{name}/logs", params={"follow": 1}, timeout=120,
                      headers={"Authorization": f"Bearer {key}"}) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if line.startswith("event: end"):
                break
            if line.startswith("data: line "):
                latencies.append(time.time() - float(line.split()[-1]))
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--poll", type=float, default=None, help="TESSERA_SUPERVISOR_POLL of the replicas")
    parser.add_argument("--single", action="store_true", help="one replica, followed through itself")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="the src/ folder of an older checkout: its single server, without --artifacts")
    args = parser.parse_args()
    proc = server_proc()
    folder = Path(tempfile.mkdtemp(prefix="tessera-replicas-logs-"))
    postgres = proc.start_postgres() if args.db == "postgres" else None
    db = postgres.url if postgres else f"sqlite:///{folder / 'shared.db'}"
    env = {**proc.server_env(folder), "TESSERA_SECRET_KEY": Fernet.generate_key().decode()}
    env.pop("TESSERA_SUPERVISOR_POLL", None)          # the server's own cadence unless --poll
    if args.poll is not None:
        env["TESSERA_SUPERVISOR_POLL"] = str(args.poll)
    if args.baseline:
        env["PYTHONPATH"] = str(args.baseline.resolve())
        args.single = True
    replicas: list[Any] = []
    try:
        serve = [] if args.baseline else ["--artifacts", str(folder / "artifacts")]
        replicas = [replica(folder, n, env, db, serve) for n in ("a" if args.single else "ab")]
        replicas[0].add_users({"alice": "red"})
        for server in replicas:
            server.start()
        ids = [replica_id(r) for r in replicas]
        script = folder / "printer.py"
        script.write_text(PRINTER)
        with replicas[0].client("alice") as a:
            a.post("runs", json={"spec": {"name": "ticker", "command": f"{sys.executable} {script} {args.lines} "
                                          f"{args.interval}"}}).raise_for_status()
            latencies = follow(f"{replicas[-1].url}/api/v1/", replicas[0].keys["alice"], "ticker")
            described = a.get("runs/ticker").raise_for_status().json()
        supervisor = (described.get("supervisor") or {}).get("replica")
        figures = {"code": str(args.baseline or "this checkout"), "db": args.db, "lines": len(latencies), "expected": args.lines, "interval_s": args.interval,
                   "poll_s": args.poll, "status": described["status"],
                   "replicas": len(replicas), "followed_through": "ab"[len(replicas) - 1],
                   "supervised_by": "ab"[ids.index(supervisor)] if supervisor in ids else supervisor,
                   "p50_ms": round(1000 * statistics.median(latencies), 1),
                   "p99_ms": round(1000 * percentile(latencies, 99), 1),
                   "max_ms": round(1000 * max(latencies), 1), "min_ms": round(1000 * min(latencies), 1)}
        print(f"{figures['lines']}/{args.lines} lines followed through replica {figures['followed_through']} ({args.db}), "
              f"run submitted to a, "
              f"supervised by {figures['supervised_by']}: p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} "
              f"ms, max {figures['max_ms']} ms")
        print(json.dumps(figures))
    finally:
        for server in replicas:
            server.stop()
        if postgres:
            postgres.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
