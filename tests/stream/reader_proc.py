"""A real reader process for the streaming tests: `python reader_proc.py JOBS.json OUT.json`.

`python reader_proc.py --serve` is a fork server (tests/fork_server.py): it imports torch and tessera
once, then for each command line on stdin ({"jobs", "out", "log", "env"}) forks a child that starts a
session of its own, replaces its environment with "env" (RANK, WORLD_SIZE, ...), runs the jobs as above
and exits; the server prints the child's pid, reaps it and writes its exit status to OUT.rc (-9 when
SIGKILLed). Each child is a separate OS process with its own rank environment and its own DataLoader
workers; the server only saves the ~3 s interpreter start-up per process (two shared cores run dozens of
these per test run).

The rank comes from RANK / WORLD_SIZE / LOCAL_WORLD_SIZE in the environment, as under torchrun. Each job
builds a StreamingDataset and a StreamingDataLoader (with real DataLoader worker processes when
num_workers > 0), optionally loads a saved state, iterates, checks every sample's payload against its id,
and records the ids of every batch. Job keys (all optional but "dataset"):

    dataset      StreamingDataset kwargs; "streams" is a list of Stream kwargs
    num_workers  DataLoader workers (default 0)
    batch_path   StreamingDataLoader(batch_path=True)
    epochs       loader epochs to run (default 1)
    load_state   path of a state JSON to load before iterating (waited for: another process writes it)
    stop_after   stop after this many batches of the first epoch; the state then is saved
    save_state   path to write the state JSON to (after stop_after, else after the first epoch);
                 "{rank}" in it is replaced by the RANK
    check        "elastic" or "blob:<size>": verify payload columns against the id
    sleep        seconds to sleep after each batch (lets a test watch or kill the process)
    usage_of     cache folder whose shard bytes are recorded after every batch
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import fork_server
import helpers
import numpy as np

from tessera.stream import Stream, StreamingDataLoader, StreamingDataset


def make_dataset(kwargs: dict) -> StreamingDataset:
    kwargs = dict(kwargs)
    if "streams" in kwargs:
        kwargs["streams"] = [Stream(**s) for s in kwargs["streams"]]
    return StreamingDataset(**kwargs)


def count_bad(batch: dict, ids: list[int], check: str | None) -> int:
    """Samples of `batch` whose payload does not match their id."""
    if not check:
        return 0
    bad = 0
    if check == "elastic":
        x = np.asarray(batch["x"])
        for row, i in enumerate(ids):
            bad += not np.array_equal(x[row], helpers.expected_x(i))
            bad += "s" in batch and batch["s"][row] != helpers.expected_s(i)  # absent: columns=["id", "x"]
        return bad
    size = int(check.split(":")[1])
    blob = np.asarray(batch["blob"]) if not isinstance(batch["blob"], list) else batch["blob"]
    for row, i in enumerate(ids):
        bad += not np.array_equal(np.asarray(blob[row]), helpers.expected_blob(i, size))
    return bad


def run(job: dict) -> dict:
    t0 = time.perf_counter()
    ds = make_dataset(job["dataset"])
    loader = StreamingDataLoader(ds, batch_size=ds.batch_size, num_workers=job.get("num_workers", 0),
                                 batch_path=job.get("batch_path", False))
    if job.get("load_state"):
        loader.load_state_dict(json.loads(wait_for_file(Path(job["load_state"])).read_text()))
    out: dict = {"label": job.get("label"), "config": job.get("config"), "epochs": [], "bad": 0, "len": len(ds),
                 "usage": [], "end_states": []}
    stop_after = job.get("stop_after")
    state = None
    for _ in range(job.get("epochs", 1)):
        batches: list[list[int]] = []
        for batch in loader:
            ids = [int(i) for i in batch["id"]]
            out["bad"] += count_bad(batch, ids, job.get("check"))
            batches.append(ids)
            if job.get("usage_of"):
                out["usage"].append(helpers.cache_data_bytes(Path(job["usage_of"])))
            if job.get("sleep"):
                time.sleep(job["sleep"])
            if stop_after is not None and len(batches) == stop_after:
                state = loader.state_dict()
                break
        out["epochs"].append(batches)
        if state is not None:
            break
        out["end_states"].append(loader.state_dict())
    state = state if state is not None else out["end_states"][0]
    out["state"] = state
    out["seconds"] = round(time.perf_counter() - t0, 3)
    if job.get("save_state"):
        write_atomic(Path(job["save_state"].format(rank=os.environ.get("RANK", "0"))), json.dumps(state))
    return out


def wait_for_file(path: Path, timeout: float = 120.0) -> Path:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)
    return path


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def run_jobs(jobs_path: str, out_path: str) -> None:
    jobs = json.loads(Path(jobs_path).read_text())
    write_atomic(Path(out_path), json.dumps([run(job) for job in jobs]))


def serve() -> None:
    """Fork a reader per command line on stdin ({"jobs", "out", "log", "env"}, see fork_server.py); its exit
    status goes to OUT.rc, where helpers.Proc.poll looks for it."""
    fork_server.serve(lambda cmd: run_jobs(cmd["jobs"], cmd["out"]), rc_path=lambda cmd: cmd["out"] + ".rc")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        run_jobs(sys.argv[1], sys.argv[2])
