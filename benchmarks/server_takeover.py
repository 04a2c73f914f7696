"""Issue 23's takeover after `kill -9` of a replica: how long until another replica supervises each of its
runs (median and p99), against the lease's length.

    .venv/bin/python benchmarks/server_takeover.py [--runs 20] [--rounds 8] [--lease 5] [--poll 1]

Two real `tessera server start` replicas (private homes, PostgreSQL from scripts/postgres-up.sh, one
artifacts folder) serve team red. Replica A starts alone, `--runs` runs are submitted to it (each sleeps
for as long as the benchmark lasts) and it takes all their leases; then B starts. Each round kills the
process group of the replica holding the leases with SIGKILL and measures, per run, the time from the
kill until the `run_leases` row names the other replica (read straight from PostgreSQL every 20 ms), then
starts the killed replica again for the next round, so the runs change hands every round. Both replicas
run with `--lease-seconds LEASE` and `TESSERA_SUPERVISOR_POLL=POLL`: a takeover is expected between
LEASE - POLL and LEASE + POLL after the kill (the lease's last renewal is up to one pass old; the taker
looks once a pass).

Prints the figures, then one JSON line with them (the last line of stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from cryptography.fernet import Fernet
from server_api import server_proc  # the test suite's server driver, loaded once
from server_replicas_logs import percentile, replica, replica_id


def sql(url: str, query: str) -> list[tuple]:  # type: ignore[type-arg]
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as db:
        return db.execute(query).fetchall()


def owners(url: str) -> dict[str, str | None]:
    return dict(sql(url, "SELECT run_id, owner FROM run_leases"))


def wait_owned(url: str, ids: set[str], owner: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while {run_id for run_id, who in owners(url).items() if who == owner} < ids:
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica {owner} did not take every run within {timeout} s")
        time.sleep(0.1)


def takeover_round(url: str, ids: set[str], killed: Any, survivor_id: str) -> list[float]:
    """Kill `killed`'s process group; seconds until each run's lease names the survivor."""
    start = time.monotonic()
    os.killpg(killed.process.pid, 9)
    killed.process.wait(10)
    taken: dict[str, float] = {}
    while len(taken) < len(ids):
        now = time.monotonic() - start
        for run_id, who in owners(url).items():
            if run_id in ids and who == survivor_id and run_id not in taken:
                taken[run_id] = now
        if now > 120:
            raise RuntimeError(f"{len(ids) - len(taken)} runs were not taken over within 120 s")
        time.sleep(0.02)
    return list(taken.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--lease", type=float, default=5.0, help="--lease-seconds of both replicas")
    parser.add_argument("--poll", type=float, default=1.0, help="TESSERA_SUPERVISOR_POLL of both replicas")
    args = parser.parse_args()
    proc = server_proc()
    folder = Path(tempfile.mkdtemp(prefix="tessera-takeover-"))
    postgres = proc.start_postgres()
    env = {**proc.server_env(folder), "TESSERA_SECRET_KEY": Fernet.generate_key().decode(),
           "TESSERA_SUPERVISOR_POLL": str(args.poll)}
    replica_args = ["--artifacts", str(folder / "artifacts"), "--lease-seconds", str(args.lease)]
    replicas: list[Any] = []
    latencies: list[float] = []
    try:
        holder, other = replicas = [replica(folder, n, env, postgres.url, replica_args) for n in "ab"]
        holder.add_users({"alice": "red"})
        holder.start()
        with holder.client("alice") as api:
            runs = {api.post("runs", json={"spec": {"name": f"long-{i:03d}", "command": "sleep 3600"}})
                    .raise_for_status().json()["id"] for i in range(args.runs)}
        wait_owned(postgres.url, runs, replica_id(holder))
        other.start()
        other_id = replica_id(other)
        for _ in range(args.rounds):
            latencies += takeover_round(postgres.url, runs, holder, other_id)
            holder.start()     # again, on its home: a new process, a new replica id
            holder, other, other_id = other, holder, replica_id(holder)
    finally:
        for server in replicas:
            server.stop()
        for (handle,) in sql(postgres.url, "SELECT handle FROM resumptions WHERE handle IS NOT NULL"):
            with contextlib.suppress(ProcessLookupError):   # the runs' launchers outlive the replicas
                os.killpg(json.loads(handle)["pid"], 9)
        postgres.stop()
        shutil.rmtree(folder, ignore_errors=True)
    figures = {"benchmark": "server_takeover", "runs": args.runs, "rounds": args.rounds, "lease_s": args.lease,
               "poll_s": args.poll, "takeovers": len(latencies), "median_s": statistics.median(latencies),
               "p99_s": percentile(latencies, 99), "min_s": min(latencies), "max_s": max(latencies)}
    print(f"takeover after kill -9: {len(latencies)} runs over {args.rounds} rounds, lease {args.lease:g} s, "
          f"poll {args.poll:g} s: median {figures['median_s']:.2f} s, p99 {figures['p99_s']:.2f} s "
          f"(min {figures['min_s']:.2f}, max {figures['max_s']:.2f})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
