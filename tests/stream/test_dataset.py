"""Issue 4 properties of StreamingDataset / StreamingDataLoader, proven with real processes.

Every rank is a separate OS process with RANK / WORLD_SIZE / LOCAL_WORLD_SIZE in its environment (as
under torchrun), reading through a StreamingDataLoader with real DataLoader worker processes. Most rank
processes are forked by one `reader_proc.py --serve` process (it imports torch once; see reader_proc.py),
a few are fresh interpreters (determinism, resume). Samples carry their id and a payload derived from it,
so every process also proves it read the right bytes.

The reference for "global batch t" is the documented sequence S of the epoch plan:
global batch t = S[t*G + j] for j < G; the last, when short, holds the rest of S padded with the start of
S only up to a multiple of the world size W (as MosaicML Streaming pads; nothing in one process).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import Counter
from pathlib import Path

import helpers
import numpy as np
import pytest
from helpers import Proc, flatten, global_batches, run_layout, wait_all

from tessera.shards import DatasetNotFound, ShardWriter
from tessera.storage import open_store
from tessera.storage.local import is_temp_name
from tessera.stream import (
    CacheLimitError,
    PlanStateMismatch,
    Stream,
    StreamingDataLoader,
    StreamingDataset,
)

G = 12  # global batch: divisible by every world size used (1, 2, 4)
N_A, B_BASE, N_B = 495, 10_000, 150  # dataset A holds ids 0..494, dataset B ids 10000..10149
N_BATCHES = 42  # global batches of an epoch of "main": ceil((495 + 3 padding) / 12)
WORLD_ENV = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK")


# --- the layouts run ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    helpers.write_elastic(root / "A", range(N_A))
    helpers.write_elastic(root / "B", range(B_BASE, B_BASE + N_B), size_limit=1100)
    return {"A": root / "A", "B": root / "B", "cache": root / "cache", "work": root / "work"}


def configs(data: dict[str, Path]) -> dict[str, dict]:
    """Dataset settings (without batch_size) and their weighted epoch size T."""
    a = {"remote": str(data["A"]), "local": str(data["cache"] / "A")}
    b = {"remote": str(data["B"]), "local": str(data["cache"] / "B")}
    return {
        # 6 lanes: 1 and 2 nodes divide them, and 2 nodes x 2 ranks; 4 nodes x 1 rank does not.
        "main": {"kw": {**a, "shuffle": True, "shuffle_block_size": 40, "num_canonical_nodes": 6}, "T": N_A},
        # 3 lanes: 2 nodes (of 1 or 2 ranks) do not divide them.
        "lanes3": {"kw": {**a, "shuffle": True, "shuffle_seed": 7, "shuffle_block_size": 64,
                          "num_canonical_nodes": 3}, "T": N_A},
        # Absolute weights: A repeated 1.5x (every sample once, 247 of them twice), 100 of B's 150.
        "mix_abs": {"kw": {"streams": [{**a, "repeat": 1.5}, {**b, "choose": 100}], "shuffle": True,
                           "shuffle_block_size": 48, "num_canonical_nodes": 7}, "T": 742 + 100},
        # Relative weights: 70% / 30% of an epoch of 500 (350 of A's samples, all 150 of B's).
        "mix_rel": {"kw": {"streams": [{**a, "proportion": 0.7}, {**b, "proportion": 0.3}], "epoch_size": 500,
                           "shuffle": True, "shuffle_block_size": 48, "num_canonical_nodes": 6}, "T": 500},
    }


def job(data: dict, config: str, world: int, workers: int, **extra) -> dict:
    kw = {**configs(data)[config]["kw"], "batch_size": G // world}
    if "columns" in extra:  # fixed-size columns only: workers hand batches over as BatchRefs
        kw["columns"] = extra.pop("columns")
    return {"label": extra.pop("label", f"{config}/w{workers}"), "config": config, "dataset": kw,
            "num_workers": workers, "check": "elastic", **extra}


def layout_jobs(data: dict, world: int, spec: list[tuple]) -> list[dict]:
    return [job(data, config, world, workers, **(extra[0] if extra else {})) for config, workers, *extra in spec]


def state_path(data: dict, name: str) -> str:
    return str(data["work"] / f"{name}.rank{{rank}}.json")


def saved_state(data: dict, name: str, rank: int = 0) -> Path:
    return Path(state_path(data, name).format(rank=rank))


# (name, world size, ranks per node, fresh interpreter?, jobs)
FIXED = ["id", "x"]  # the fixed-size columns of the elastic datasets


def layouts(data: dict) -> list[tuple]:
    stop17, stop30 = state_path(data, "stop17"), state_path(data, "stop30")
    refs_stop17 = state_path(data, "refs_stop17")
    end_of_epoch, after_last = state_path(data, "end_of_epoch"), state_path(data, "after_last")
    return [
        ("L1", 1, 1, False, [("main", 0), ("main", 1), ("main", 3), ("lanes3", 0), ("mix_abs", 0), ("mix_rel", 3),
                             ("main", 1, {"label": "two_epochs", "epochs": 2, "save_state": end_of_epoch}),
                             ("main", 0, {"label": "after_last", "stop_after": N_BATCHES,
                                          "save_state": after_last}),
                             ("main", 0, {"label": "batch_path/w0", "batch_path": True}),
                             ("main", 3, {"label": "refs/w3", "batch_path": True, "columns": FIXED}),
                             ("main", 2, {"label": "refs_samples/w2", "columns": FIXED})]),
        ("L2", 2, 2, False, [("main", 0), ("main", 1), ("main", 3), ("mix_abs", 1), ("mix_rel", 0),
                             ("main", 1, {"label": "stop17", "stop_after": 17, "save_state": stop17}),
                             ("main", 1, {"label": "batch_path/w1", "batch_path": True}),
                             ("main", 3, {"label": "refs_stop17", "batch_path": True, "columns": FIXED,
                                          "stop_after": 17, "save_state": refs_stop17})]),
        ("L2n", 2, 1, False, [("main", 1), ("lanes3", 3), ("mix_abs", 3)]),
        ("L4", 4, 2, False, [("main", 0), ("main", 1), ("main", 3), ("lanes3", 1), ("mix_abs", 0), ("mix_rel", 1),
                             ("main", 3, {"label": "stop30", "stop_after": 30, "save_state": stop30}),
                             ("mix_abs", 2, {"label": "refs_mix/w2", "batch_path": True, "columns": FIXED})]),
        # Fresh processes that load states saved above, on other world sizes and worker counts.
        ("R4", 4, 1, False, [("main", 3, {"label": "resume17", "load_state": str(saved_state(data, "stop17"))}),
                             ("main", 1, {"label": "after_last_resumed",
                                          "load_state": str(saved_state(data, "after_last"))})]),
        ("DET", 2, 2, True, [("main", 0), ("main", 3),
                             ("main", 0, {"label": "resume30", "load_state": str(saved_state(data, "stop30"))}),
                             ("main", 3, {"label": "next_epoch",
                                          "load_state": str(saved_state(data, "end_of_epoch"))})]),
    ]


@pytest.fixture(scope="module")
def runs(data: dict, server) -> dict[tuple[str, str], list[dict]]:
    """{(layout, job label): [job result of rank 0, rank 1, ...]} for every layout above."""
    started = time.monotonic()
    procs: dict[str, list[Proc]] = {}
    for name, world, per_node, fresh, spec in layouts(data):
        jobs = layout_jobs(data, world, spec)
        procs[name] = run_layout(data["work"], name, world, per_node, jobs, server=None if fresh else server,
                                 PYTHONHASHSEED=str(17 + len(procs)))
    out: dict[tuple[str, str], list[dict]] = {}
    for name, ps in procs.items():
        for rank_results in zip(*wait_all(ps, timeout=240), strict=True):
            out[(name, rank_results[0]["label"])] = list(rank_results)
    print(f"layout runs: {time.monotonic() - started:.1f} s")
    return out


@pytest.fixture(scope="module")
def reference(data: dict):
    """reference(config, epoch) -> S as sample ids, from the plan of a dataset built in this process."""
    cache: dict = {}

    def get(config: str, epoch: int = 0) -> np.ndarray:
        if (config, epoch) not in cache:
            kw = dict(configs(data)[config]["kw"])
            if "streams" in kw:
                kw["streams"] = [Stream(**s) for s in kw["streams"]]
            ds = StreamingDataset(**kw, batch_size=G)
            plan = ds._run.epoch(epoch)
            index = plan.samples_at(np.arange(len(plan)))
            # Global sample index -> id: stream A's samples come first (ids 0..), then B's.
            cache[(config, epoch)] = np.where(index < N_A, index, index - N_A + B_BASE) if "streams" in kw \
                else index
        return cache[(config, epoch)]

    return get


def ref_global_batches(s: np.ndarray, start: int = 0, world: int = 1) -> list[Counter]:
    n = len(s)
    sizes = [min(G, -(-(n - t * G) // world) * world) for t in range(math.ceil(n / G))]
    return [Counter(s[(t * G + np.arange(sizes[t])) % n].tolist()) for t in range(start // G, len(sizes))]


def full_epochs(runs: dict, config: str) -> list[tuple[str, str, list[dict]]]:
    """Every (layout, label, ranks) that ran `config` for one whole fresh epoch."""
    return [(layout, label, ranks) for (layout, label), ranks in runs.items()
            if label.split("/")[0] == config and "/w" in label]


def rank_batches(ranks: list[dict], epoch: int = 0) -> list[list[list[int]]]:
    return [r["epochs"][epoch] for r in ranks]


# --- 1. deterministic -------------------------------------------------------------------------------------

def test_same_settings_give_the_same_per_rank_sequences_in_separate_processes(runs: dict) -> None:
    """Fresh interpreters (other hash seeds) and forked processes: identical per-rank sequences."""
    for label in ("main/w0", "main/w3"):
        fresh, forked = runs[("DET", label)], runs[("L2", label)]
        for rank in range(2):
            assert fresh[rank]["epochs"][0] == forked[rank]["epochs"][0], (label, rank)
    # The worker count does not change what a rank reads, nor its order.
    for layout in ("L1", "L2", "L4"):
        seqs = [rank_batches(runs[(layout, f"main/w{w}")]) for w in (0, 1, 3)]
        assert seqs[0] == seqs[1] == seqs[2], layout
    assert runs[("L2", "main/w0")][0]["epochs"][0] != runs[("L2", "main/w0")][1]["epochs"][0]


# --- 2. elastic --------------------------------------------------------------------------------------------

def test_every_layout_serves_the_same_global_batches(runs: dict, reference, data) -> None:
    seen: dict[str, set] = {}
    for config in configs(data):
        for layout, label, ranks in full_epochs(runs, config):
            want = ref_global_batches(reference(config), world=len(ranks))
            got = global_batches(rank_batches(ranks))
            assert len(got) == len(want), (layout, label)
            for t, (g, w) in enumerate(zip(got, want, strict=True)):
                assert g == w, f"{layout} {label}: global batch {t} differs"
            seen.setdefault(config, set()).add((layout, label.split("/w")[1]))
    # What ran: world sizes 1, 2, 4 with 0, 1 and 3 workers, node counts that do not divide the lanes.
    assert {(lay, w) for lay in ("L1", "L2", "L4") for w in "013"} <= seen["main"]
    assert {("L2n", "3"), ("L4", "1"), ("L1", "0")} <= seen["lanes3"]  # 2 nodes vs 3 lanes
    assert {("L1", "0"), ("L2", "1"), ("L2n", "3"), ("L4", "0")} <= seen["mix_abs"]


def test_world_1_reads_the_plan_sequence_in_order(runs: dict, reference) -> None:
    s = reference("main")
    assert flatten(runs[("L1", "main/w0")][0]["epochs"][0]) == s.tolist()  # no wrap-around in one process


def test_every_rank_reads_equal_batches_the_last_partial(runs: dict, reference) -> None:
    for (layout, label), ranks in runs.items():
        if "/w" not in label:
            continue
        config = ranks[0]["config"]
        n = len(reference(config))
        n_batches, per_rank = math.ceil(n / G), G // len(ranks)
        last = -(-(n - (n_batches - 1) * G) // len(ranks))
        for r in ranks:
            assert [len(b) for b in r["epochs"][0]] == [per_rank] * (n_batches - 1) + [last], (layout, label)
            assert r["len"] == (n_batches - 1) * per_rank + last  # len(ds): samples per rank per epoch
            assert r["bad"] == 0, (layout, label)  # every payload matched its id


# --- 3. exactly once ----------------------------------------------------------------------------------------

def documented_extras(s: np.ndarray, lanes: int, T: int, world: int = 1) -> Counter:
    """The repeats the dataset docstring and plan document, from the sequence S (len(S) = T + padding).

    Lanes are cut at l*T//L and all padded to M = ceil(T/L): a short lane l repeats its first sample
    S[l] at its last position S[(M-1)*L + l]. The last global batch is then padded with S[0:wrap] up to
    a multiple of the world size.
    """
    m = -(-T // lanes)
    lane_size = np.diff(np.arange(lanes + 1) * T // lanes)
    short = np.flatnonzero(lane_size < m)
    assert len(s) == T + len(short) == lanes * m
    np.testing.assert_array_equal(s[(m - 1) * lanes + short], s[short])
    wrap = math.ceil(len(s) / world) * world - len(s)
    return Counter(s[short].tolist()) + Counter(s[:wrap].tolist())


def check_weighted(config: str, counts: Counter) -> None:
    """The multiset of an epoch without padding obeys the stream weights."""
    a = np.array([counts.get(i, 0) for i in range(N_A)])
    b = np.array([counts.get(i, 0) for i in range(B_BASE, B_BASE + N_B)])
    assert sum(counts.values()) == int(a.sum() + b.sum())  # no unknown ids
    if config in ("main", "lanes3"):
        assert a.tolist() == [1] * N_A and b.sum() == 0
    elif config == "mix_abs":  # repeat=1.5 of 1000; choose=200 of 300
        assert set(a.tolist()) == {1, 2} and (a == 2).sum() == 742 - N_A
        assert set(b.tolist()) == {0, 1} and b.sum() == 100
    elif config == "mix_rel":  # 350 distinct samples of A, all 150 of B
        assert set(a.tolist()) == {0, 1} and a.sum() == 350
        assert b.tolist() == [1] * N_B
    else:
        raise AssertionError(config)


def test_each_weighted_sample_once_per_epoch_plus_counted_padding(runs: dict, reference, data) -> None:
    for config, spec in configs(data).items():
        s = reference(config)
        for layout, label, ranks in full_epochs(runs, config):
            extras = documented_extras(s, spec["kw"]["num_canonical_nodes"], spec["T"], len(ranks))
            served = Counter(flatten(flatten(rank_batches(ranks))))
            assert sum(served.values()) == spec["T"] + sum(extras.values()), (layout, label)
            assert not extras - served
            check_weighted(config, served - extras)
    # The padding is really there: 3 padded lanes (main: len(S) = 498), and on 4 ranks a wrap of 2 (to 500).
    assert sum(documented_extras(reference("main"), 6, N_A).values()) == 3
    assert sum(documented_extras(reference("main"), 6, N_A, 4).values()) == 3 + 2


# --- 4. resume --------------------------------------------------------------------------------------------

def check_resumed(before: list[dict], after: list[dict], k: int, s: np.ndarray) -> None:
    """Global batches before the state (k of them) and after it, on other layouts, make up the epoch."""
    want = ref_global_batches(s, world=len(after))
    got = global_batches(rank_batches(before))
    assert len(got) == k and got == want[:k]
    resumed = global_batches(rank_batches(after))
    assert resumed == want[k:]  # continues at global batch k: nothing skipped, nothing repeated
    assert sum(got + resumed, Counter()) == sum(want, Counter())


def test_state_resumes_on_another_world_size_and_worker_count(runs: dict, reference, data) -> None:
    s = reference("main")
    # World 2 (1 worker) after 17 batches -> world 4 on 4 nodes (3 workers each).
    check_resumed(runs[("L2", "stop17")], runs[("R4", "resume17")], 17, s)
    # World 4 (3 workers) after 30 batches -> world 2 in fresh interpreters (no workers).
    check_resumed(runs[("L4", "stop30")], runs[("DET", "resume30")], 30, s)
    for name, world, k in (("stop17", 2, 17), ("stop30", 4, 30)):
        states = [json.loads(saved_state(data, name, r).read_text()) for r in range(world)]
        assert all(st == states[0] for st in states)  # every rank saves the same, topology-free state
        assert states[0]["epoch"] == 0 and states[0]["samples_consumed"] == k * G
        text = json.dumps(states[0])
        assert len(text) < 1024, text  # small: no per-sample or per-shard data
        assert not {"rank", "world_size", "num_workers"} & set(states[0])


def test_finished_epoch_resumes_into_a_different_complete_next_epoch(runs: dict, reference) -> None:
    two = runs[("L1", "two_epochs")][0]
    s0, s1 = reference("main", 0), reference("main", 1)
    assert global_batches([two["epochs"][0]]) == ref_global_batches(s0)
    assert global_batches([two["epochs"][1]]) == ref_global_batches(s1)
    assert two["epochs"][0] != two["epochs"][1]
    epoch0, epoch1 = global_batches([two["epochs"][0]]), global_batches([two["epochs"][1]])
    same = sum(a == b for a, b in zip(epoch0, epoch1, strict=True))
    assert same == 0  # no global batch repeats between epochs
    served = Counter(flatten(two["epochs"][1]))
    extras = documented_extras(s1, 6, N_A)
    check_weighted("main", served - extras)
    # The state after a finished epoch points at the start of the next one ...
    assert [(st["epoch"], st["samples_consumed"]) for st in two["end_states"]] == [(1, 0), (2, 0)]
    # ... and a fresh world-2 process resuming it reads exactly that next epoch.
    assert global_batches(rank_batches(runs[("DET", "next_epoch")])) == ref_global_batches(s1, world=2)
    # A state taken right after the last batch (inside the loop) also resumes into the next epoch.
    after_last = runs[("L1", "after_last")][0]
    assert len(after_last["epochs"][0]) == N_BATCHES
    assert after_last["state"]["epoch"] == 0 and after_last["state"]["samples_consumed"] == len(s0)
    assert global_batches(rank_batches(runs[("R4", "after_last_resumed")])) == ref_global_batches(s1, world=4)


# --- 9. batch path -----------------------------------------------------------------------------------------

def test_batch_path_yields_the_per_sample_path_order(runs: dict) -> None:
    """Also when workers hand batches over as BatchRefs in groups (fixed-size columns, workers > 0, on
    the batch path or the per-sample path with the default collate): the same per-rank batches, one or
    several streams, and the same resume state mid-epoch."""
    pairs = [(("L1", "batch_path/w0"), ("L1", "main/w0")), (("L2", "batch_path/w1"), ("L2", "main/w1")),
             (("L1", "refs/w3"), ("L1", "main/w0")), (("L4", "refs_mix/w2"), ("L4", "mix_abs/w0")),
             (("L1", "refs_samples/w2"), ("L1", "main/w0"))]  # per-sample path, default collate
    for fast_key, slow_key in pairs:
        fast, slow = runs[fast_key], runs[slow_key]
        for f, sl in zip(fast, slow, strict=True):
            assert f["epochs"][0] == sl["epochs"][0], fast_key
            assert f["bad"] == 0  # stacked columns carry the right payloads
    stopped, full = runs[("L2", "refs_stop17")], runs[("L2", "main/w1")]
    for f, sl, plain in zip(stopped, full, runs[("L2", "stop17")], strict=True):
        assert f["epochs"][0] == sl["epochs"][0][:17]
        assert f["state"] == plain["state"]


# --- 5. crash safety, shared cache, /dev/shm -------------------------------------------------------------

BLOB = 96 * 1024  # bytes per sample: shards of ~1.5 MB take a while to download


def blob_job(remote: str, cache: Path, workers: int, seed: int = 1, **extra) -> dict:
    kw = {"remote": remote, "local": str(cache), "shuffle": True, "shuffle_seed": seed, "batch_size": 8,
          "num_canonical_nodes": 2, "shuffle_block_size": 64}
    return {"dataset": {**kw, **extra.pop("dataset", {})}, "num_workers": workers, "check": f"blob:{BLOB}",
            **extra}


# torch's tensor transport and CPython's multiprocessing semaphores (DataLoader queues; POSIX named
# semaphores are /dev/shm/sem.*) live in /dev/shm; nothing of tessera's may appear there, and nothing may
# be left behind. Other jobs on the machine may use /dev/shm meanwhile, so the names checked are those
# our processes have open or mapped.
PYTHON_SHM = ("torch_", "sem.")


def check_blob_epoch(result: dict, n: int) -> None:
    served = Counter(flatten(result["epochs"][0]))
    assert set(served) == set(range(n)) and result["bad"] == 0
    assert sum(served.values()) - n < 2 + 8  # only documented padding (< lanes) and wrap (< batch)


def watch_until_done(procs: list[Proc], shm_used: dict[str, set[str]]) -> None:
    while any(p.poll() is None for p in procs):
        for p in procs:
            shm_used.setdefault(p.name, set()).update(p.shm_names())
        time.sleep(0.005)


def test_kill_mid_download_leaves_a_usable_cache_and_jobs_share_it(s3_bucket: str, server, tmp_path: Path) -> None:
    n = 256
    remote = f"{s3_bucket}/blobs"
    helpers.write_blobs(remote, range(n), BLOB, size_limit="1.5mb")
    shm_used: dict[str, set[str]] = {}
    for attempt in range(3):  # the download seen in flight may complete before the kill lands: try again
        cache = tmp_path / f"cache{attempt}"
        victim = Proc(tmp_path, "victim", [blob_job(remote, cache, workers=2)], helpers.rank_env(0, 1, 1), server)
        deadline = time.monotonic() + 60
        in_flight: list[str] = []
        while not in_flight:
            assert victim.poll() is None, f"the reader finished before it could be killed:\n{victim.log()}"
            assert time.monotonic() < deadline, f"never saw a download in flight:\n{victim.log()}"
            shm_used.setdefault("victim", set()).update(victim.shm_names())
            in_flight = [f for f in victim.open_files() if f.startswith(str(cache)) and is_temp_name(Path(f).name)]
            time.sleep(0.001)
        killed = victim.kill_readers()  # kill -9 the rank and its DataLoader workers while they write a shard
        assert len(killed) >= 2  # the rank and (at least) the worker writing the shard
        victim.wait_gone()
        assert victim.poll() == -9
        leftovers = [f for f in helpers.shard_files(cache) if is_temp_name(Path(f).name)]
        if leftovers:
            break
    assert leftovers, "the kill should have left a partial download behind"

    # Two new jobs (other seeds and worker counts) share the crashed cache, concurrently.
    jobs = [Proc(tmp_path, "after-crash", [blob_job(remote, cache, workers=2)], helpers.rank_env(0, 1, 1), server),
            Proc(tmp_path, "neighbour", [blob_job(remote, cache, workers=0, seed=5)], helpers.rank_env(0, 1, 1),
                 server)]
    watch_until_done(jobs, shm_used)
    for result in wait_all(jobs, timeout=60):
        check_blob_epoch(result[0], n)
    for p in jobs:
        p.wait_gone()
    # No shared-memory state of ours, and nothing our processes used is left in /dev/shm.
    assert shm_used["neighbour"] == set()  # a reader without workers never touches /dev/shm
    used = set().union(*shm_used.values())
    assert {e for e in used if not e.startswith(PYTHON_SHM)} == set()
    assert used & set(os.listdir("/dev/shm")) == set()
    # The crash's partial downloads do not linger once the shards are complete.
    assert [f for f in helpers.shard_files(cache) if is_temp_name(Path(f).name)] == []


# --- 6. cache limit ---------------------------------------------------------------------------------------

def test_cache_limit_bounds_disk_use_during_a_remote_epoch(s3_bucket: str, server, tmp_path: Path) -> None:
    n = 192
    remote = f"{s3_bucket}/blobs"
    helpers.write_blobs(remote, range(n), BLOB, size_limit="1mb")
    sizes = [e["raw_data"]["bytes"] for e in json.loads(open_store(remote).get("index.json"))["shards"]]
    assert len(sizes) >= 12
    limit = 3 * max(sizes)
    cache = tmp_path / "cache"
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], helpers.cache_data_bytes(cache))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        proc = Proc(tmp_path, "limited", [blob_job(remote, cache, workers=0, sleep=0.002, usage_of=str(cache),
                                                   dataset={"cache_limit": limit})],
                    helpers.rank_env(0, 1, 1), server)
        result = proc.wait(90)[0]
    finally:
        stop.set()
        watcher.join()
    check_blob_epoch(result, n)
    bound = limit + max(sizes)  # cache_limit plus one in-flight shard
    assert max(result["usage"]) <= limit, result["usage"]
    assert peak[0] <= bound, f"cache held {peak[0]} bytes; limit {limit}, bound {bound}"
    assert sum(sizes) > 3 * limit  # the epoch could only fit by evicting


def test_cache_limit_never_evicts_data_without_a_remote(tmp_path: Path) -> None:
    remote, local_only = tmp_path / "remote", tmp_path / "local_only"
    helpers.write_elastic(remote, range(300), size_limit=4000)
    helpers.write_elastic(local_only, range(B_BASE, B_BASE + N_B), size_limit=4000)
    before = sorted(os.listdir(local_only))
    shard = max(e["raw_data"]["bytes"] for e in json.loads((remote / "index.json").read_text())["shards"])
    ds = StreamingDataset(streams=[Stream(remote=str(remote), local=str(tmp_path / "cache")),
                                   Stream(local=str(local_only))],
                          cache_limit=3 * shard, shuffle=True, batch_size=10, num_canonical_nodes=2)
    ids = [int(x["id"]) for x in ds]
    assert set(ids) == set(range(300)) | set(range(B_BASE, B_BASE + N_B))
    assert sorted(os.listdir(local_only)) == before  # the only copy of stream 2 is intact


def test_too_small_cache_limit_fails_at_construction(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    helpers.write_blobs(remote, range(40), 4096, size_limit=40_000)
    shard = max(e["raw_data"]["bytes"] for e in json.loads((remote / "index.json").read_text())["shards"])
    cache = tmp_path / "cache"
    with pytest.raises(CacheLimitError, match="cache_limit"):
        StreamingDataset(remote=str(remote), local=str(cache), cache_limit=shard + shard // 2, batch_size=4)
    assert helpers.shard_files(cache) == []  # nothing was downloaded
    StreamingDataset(remote=str(remote), local=str(cache), cache_limit=f"{4 * shard}b", batch_size=4)


# --- 7. changed remote index -------------------------------------------------------------------------------

@pytest.mark.parametrize("rewrite", ["overwrite", "same_names_hashed", "same_names_resized"])
def test_changed_remote_dataset_is_detected(rewrite: str, s3_bucket: str, tmp_path: Path) -> None:
    """Fill the cache, rewrite the remote: the new data is served, the old state is refused."""
    remote, cache, n = f"{s3_bucket}/ds", tmp_path / "cache", 120
    hashes = ["xxh64"] if rewrite == "same_names_hashed" else None
    helpers.write_blobs(remote, range(n), 2000, size_limit=20_000, hashes=hashes)
    old = StreamingDataset(remote=remote, local=str(cache), shuffle=True, batch_size=6, num_canonical_nodes=2)
    loader = StreamingDataLoader(old)
    for i, _ in enumerate(loader):
        if i == 4:
            break
    state = loader.state_dict()
    assert sorted(int(x["id"]) for x in old) == list(range(n))  # the cache holds every shard
    names = sorted(os.listdir(cache))

    new_ids = range(5000, 5000 + n)
    if rewrite == "overwrite":
        helpers.write_blobs(remote, new_ids, 2000, size_limit=20_000, mode="overwrite")
    else:  # delete and write again: the new shards get the old names
        store = open_store(remote)
        store.delete_many([o.key for o in store.list()])
        size = 2000 if rewrite == "same_names_hashed" else 2001
        with ShardWriter(remote, helpers.BLOB_COLUMNS, size_limit=20_000, hashes=hashes) as w:
            for i in new_ids:
                w.write({"id": i, "blob": helpers.expected_blob(i, size)})
        assert sorted(os.listdir(cache)) == names  # stale copies under the very same names
    new = StreamingDataset(remote=remote, local=str(cache), shuffle=True, batch_size=6, num_canonical_nodes=2)
    served = [int(x["id"]) for x in new]
    assert sorted(served) == list(new_ids)
    batch = next(iter(StreamingDataLoader(new, batch_path=True)))
    want = 2001 if rewrite == "same_names_resized" else 2000
    for i, blob in zip(batch["id"].tolist(), batch["blob"], strict=True):
        np.testing.assert_array_equal(np.asarray(blob), helpers.expected_blob(i, want))
    with pytest.raises(PlanStateMismatch):
        StreamingDataLoader(new).load_state_dict(state)


# --- 8. bad settings ------------------------------------------------------------------------------------------

def test_bad_settings_are_clear_errors_before_any_download(tmp_path: Path, monkeypatch, s3_bucket: str) -> None:
    remote, cache = tmp_path / "remote", tmp_path / "cache"
    helpers.write_elastic(remote, range(200))
    ok = {"remote": str(remote), "local": str(cache), "batch_size": 4}

    ds = StreamingDataset(**ok)
    with pytest.raises(ValueError, match="batch_size=5 differs"):
        StreamingDataLoader(ds, batch_size=5)
    with pytest.raises(ValueError, match="at most one of proportion, repeat, choose"):
        Stream(remote=str(remote), proportion=0.5, repeat=2)
    with pytest.raises(ValueError, match="cannot be mixed"):
        StreamingDataset(streams=[Stream(remote=str(remote), local=str(cache), proportion=0.5),
                                  Stream(remote=str(remote), local=str(cache / "x"), repeat=2)], batch_size=4)
    with pytest.raises(DatasetNotFound, match="index.json"):
        StreamingDataset(remote=str(tmp_path / "nowhere"), local=str(tmp_path / "c2"), batch_size=4)
    with pytest.raises(DatasetNotFound, match="index.json"):
        StreamingDataset(remote=f"{s3_bucket}/nothing-here", local=str(tmp_path / "c3"), batch_size=4)
    # Ranks that do not split the global batch: replication 3 on 4 ranks.
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="replication=3 does not divide world size 4"):
        StreamingDataset(**ok, replication=3)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="rank 4 is outside world size 4"):
        StreamingDataset(**ok)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    # Unpickling runs code from the data: refused unless allowed.
    unsafe = tmp_path / "unsafe"
    with ShardWriter(unsafe, {"id": "int", "obj": "pkl"}) as w:
        for i in range(10):
            w.write({"id": i, "obj": {"i": i}})
    with pytest.raises(ValueError, match="pkl.*allow_unsafe_types"):
        StreamingDataset(remote=str(unsafe), local=str(tmp_path / "c4"), batch_size=2)
    assert helpers.shard_files(cache) == [] and helpers.shard_files(tmp_path / "c4") == []
    ds = StreamingDataset(remote=str(unsafe), local=str(tmp_path / "c4"), batch_size=2, allow_unsafe_types=True,
                          num_canonical_nodes=2)
    assert sorted(x["obj"]["i"] for x in ds) == list(range(10))
