"""The history benchmarks/server_scale.py fills a team with, and its filler for today's single server.

`history` draws the runs (tessera-free, so one drawing serves both stores): names, ids, statuses, users and
clusters spread as a team's are (a few users submit most runs, most runs complete, three clusters), created
times scattered over 90 days (not in insertion order, so the list really sorts), all of them ended (an
active run would be picked up by the servers' supervision). `points` draws a run's metric points.

Run as a script (with PYTHONPATH=OLD/src, the src/ of an older checkout) it writes that history into a team
home of the older single server, whose runs lived in `<home>/teams/<team>/state.db` (raw sqlite3) and
whose metrics in `<run folder>/metrics.jsonl`:

    python server_scale_fill.py TEAM_HOME RUNS BIG_RUN BIG_POINTS SEED
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

USERS = [f"user{i:02d}" for i in range(12)]
USER_WEIGHTS = [1 / (i + 1) for i in range(12)]          # a few users submit most runs
STATUSES, STATUS_WEIGHTS = ("COMPLETED", "FAILED", "STOPPED"), (70, 18, 12)
CLUSTERS, CLUSTER_WEIGHTS = ("local", "slurm-a100", "k8s-h100"), (20, 50, 30)
DAYS = 90


def history(runs: int, now: float, seed: int = 23) -> list[dict[str, Any]]:
    """`runs` ended runs, as plain dicts: id, name, status, user, cluster, created, ended."""
    rng = random.Random(seed)
    out = []
    for i in range(runs):
        created = now - rng.uniform(0, DAYS * 86400)
        status = rng.choices(STATUSES, STATUS_WEIGHTS)[0]
        out.append({"id": f"{rng.getrandbits(48):012x}", "name": f"hist-{i:05d}", "status": status,
                    "user": rng.choices(USERS, USER_WEIGHTS)[0],
                    "cluster": rng.choices(CLUSTERS, CLUSTER_WEIGHTS)[0],
                    "created": created, "ended": created + rng.uniform(60, 86400)})
    return out


def points(count: int) -> list[tuple[int, str]]:
    """(step, JSON line) of a run's `count` metric points, as a trainer reports them."""
    return [(step, json.dumps({"step": step, "loss/train": round(8.0 / (1 + step / 500), 6), "lr": 3e-4,
                               "throughput/tokens_per_sec": 41234.5, "throughput/mfu": 0.41}))
            for step in range(count)]


def fill_old(team_home: Path, runs: int, big_run: str, big_points: int, seed: int) -> None:
    """The history in an older single server's team home: its state.db and the big run's metrics.jsonl."""
    import time

    from tessera.platform.api.inputs import as_spec
    from tessera.platform.store.state import StateDB

    team_home.mkdir(parents=True, exist_ok=True)
    template = as_spec({"name": "template", "command": "python train.py"}).model_dump(mode="json")
    drawn = history(runs, time.time(), seed)
    with StateDB(team_home) as db, db.write() as c:
        for run in drawn:
            folder = str(team_home / "runs" / run["name"])
            spec = json.dumps({**template, "name": run["name"],
                               "compute": {**template["compute"], "cluster": run["cluster"]}})
            c.execute("INSERT INTO runs (id, name, spec, status, cluster, created, updated, ended, folder, user, "
                      "first_error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (run["id"], run["name"], spec, run["status"], run["cluster"], run["created"], run["ended"],
                       run["ended"], folder, run["user"], "exit status 1" if run["status"] == "FAILED" else None))
            c.execute("INSERT INTO resumptions (run_id, idx, cluster, cause, status, nodes, folder, submitted, "
                      "start, end, exit_code) VALUES (?, 0, ?, 'submit', ?, '[\"node-0\"]', ?, ?, ?, ?, ?)",
                      (run["id"], run["cluster"], run["status"], folder, run["created"], run["created"] + 5,
                       run["ended"], 1 if run["status"] == "FAILED" else 0))
            c.executemany("INSERT INTO events (run_id, time, kind, message) VALUES (?, ?, ?, ?)",
                          [(run["id"], run["created"], "submitted", f"submitted {run['name']}"),
                           (run["id"], run["ended"], run["status"].lower(), f"{run['status'].lower()} {run['name']}")])
    folder = team_home / "runs" / big_run
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for _, line in points(big_points)))


if __name__ == "__main__":
    home, count, big, big_count, seed_arg = sys.argv[1:6]
    fill_old(Path(home), int(count), big, int(big_count), int(seed_arg))
