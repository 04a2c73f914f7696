"""Issue 24: a dataset index at pre-training scale (50k-500k shards of 1,024 samples each).

Writes, under /tmp, an index of N shard entries whose files are hard links to a few real shard files
(tests/linked_index.py; deleted after), then measures, each in a fresh process so that peak memory is
the process's own:
- `json.load` of index.json: the reference floor;
- Tessera: `StreamingDataset(local=DIR, batch_size=8, shuffle=True)` construction and the first batch of
  `DataLoader(ds, batch_size=8, num_workers=0)`, cold (no packed index yet: this process packs it) and
  warm (another process packed it), with peak RSS; 100 batches checked against a plan built from plain
  arrays and the content rule; the memory DataLoader workers add (2 and 4 fork()ed workers: USS and PSS
  of each from /proc/PID/smaps_rollup, after their first batch);
- MosaicML Streaming on the same index (construction, first shuffled batch, peak RSS), up to
  --anchor-max shards and within --anchor-timeout seconds (else recorded as skipped / timed out).
LitData reads only its own format (no MDS index), so it is not run here (recorded so).

Prints a table, then one JSON line. `python benchmarks/index_scale.py --shards 50000 200000 500000`;
the issue's check: `--shards 488894`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests_shared import tests_module

SAMPLES = 1024
BATCHES = 100


def _rss_mb() -> float:
    """Peak RSS of this process since its exec (VmHWM: ru_maxrss would carry over the forking parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _smaps(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) / 1024
    return {"uss": fields["Private_Clean"] + fields["Private_Dirty"], "pss": fields["Pss"]}


def child_json(root: Path) -> dict[str, Any]:
    t = time.perf_counter()
    with open(root / "index.json", "rb") as f:
        json.load(f)
    return {"seconds": time.perf_counter() - t, "peak_mb": _rss_mb()}


def child_tessera(root: Path, real: int, workers: int) -> dict[str, Any]:
    import numpy as np
    from torch.utils.data import DataLoader

    from tessera.stream import StreamingDataset
    from tessera.stream.batching.epoch_plan import RunPlan
    from tessera.stream.batching.mixing import StreamShards
    from tessera.stream.batching.random_batches import BatchSchedule

    linked = tests_module("linked_index")
    base_mb = _rss_mb()
    t0 = time.perf_counter()
    ds = StreamingDataset(local=str(root), batch_size=8, shuffle=True)
    t1 = time.perf_counter()
    loader = DataLoader(ds, batch_size=8, num_workers=workers)
    it = iter(loader)
    first = next(it)
    t2 = time.perf_counter()
    out: dict[str, Any] = {"construct": t1 - t0, "first_batch": t2 - t1, "peak_mb": _rss_mb(),
                           "import_mb": base_mb}
    if workers:
        import psutil

        kids = psutil.Process().children()
        per = [_smaps(k.pid) for k in kids]
        out["workers_uss_mb"] = sum(p["uss"] for p in per)
        out["workers_pss_mb"] = sum(p["pss"] for p in per)
        return out
    batches = [first] + [next(it) for _ in range(BATCHES - 1)]
    out["peak_after_100_mb"] = _rss_mb()  # (before the reference plan below, which is the check's own)
    n = len(ds.streams[0].entries)
    ref = BatchSchedule(RunPlan([StreamShards(np.full(n, SAMPLES))], ds._config).epoch(0), 8)
    ok = 0
    for t, batch in enumerate(batches):
        shard, row = np.divmod(ref.global_batch(t), SAMPLES)
        want = np.stack([linked.expected_row(int(s), int(r), real) for s, r in zip(shard, row, strict=True)])
        ok += bool(np.array_equal(batch["tokens"].numpy(), want))
    out["correct_batches"] = ok
    return out


def child_mosaic(root: Path) -> dict[str, Any]:
    tests_module("anchors")
    from streaming import StreamingDataset as MosaicDataset
    from torch.utils.data import DataLoader

    cache = tempfile.mkdtemp(dir="/tmp")
    t0 = time.perf_counter()
    ds = MosaicDataset(local=str(root), batch_size=8, shuffle=True)
    t1 = time.perf_counter()
    next(iter(DataLoader(ds, batch_size=8, num_workers=0)))
    t2 = time.perf_counter()
    shutil.rmtree(cache, ignore_errors=True)
    return {"construct": t1 - t0, "first_batch": t2 - t1, "peak_mb": _rss_mb()}


def run_child(kind: str, root: Path, real: int, workers: int = 0, timeout: float = 1800) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, str(root), str(real), str(workers)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(_node_tmp(root))}  # the packed index and the shared plan: this dataset's own
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out after {timeout:.0f} s"}
    if done.returncode:
        return {"skipped": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _node_tmp(root: Path) -> Path:
    """The children's temp dir (TMPDIR): emptied before the cold run, so that it packs and plans."""
    return root.with_name(root.name + "-tmp")


def measure(shards: int, anchor_max: int, anchor_timeout: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="index-scale-", dir="/tmp"))
    try:
        t = time.perf_counter()
        real = tests_module("linked_index").write_linked(root, shards, SAMPLES)
        row: dict[str, Any] = {"shards": shards, "samples": shards * SAMPLES, "generate_s": time.perf_counter() - t,
                               "index_mb": (root / "index.json").stat().st_size / 1e6}
        row["json_load"] = run_child("json", root, real)
        shutil.rmtree(_node_tmp(root), ignore_errors=True)
        _node_tmp(root).mkdir()
        row["tessera_cold"] = run_child("tessera", root, real)
        row["tessera_warm"] = run_child("tessera", root, real)
        row["packed_mb"] = sum(p.stat().st_size for p in _node_tmp(root).glob("tessera-packed/*/index.packed")) / 1e6
        row["plan_mb"] = sum(p.stat().st_size for p in _node_tmp(root).glob("tessera-plans/*/*")) / 1e6
        for w in (2, 4):
            row[f"tessera_{w}_workers"] = run_child("tessera", root, real, w)
        row["mosaic"] = (run_child("mosaic", root, real, timeout=anchor_timeout) if shards <= anchor_max
                         else {"skipped": f"above --anchor-max {anchor_max} shards"})
        row["litdata"] = {"skipped": "LitData reads only its own index format, not MDS"}
        return row
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(_node_tmp(root), ignore_errors=True)


def _fmt(r: dict[str, Any], key: str) -> str:
    return "-" if "skipped" in r else f"{r[key]:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| shards | index MB | json.load s | Tessera cold: construct + 1st batch s (peak MB) | cold / json.load "
             "| warm s (peak MB) | 2 / 4 workers USS MB (PSS) | 100 batches (peak MB) | packed + plan MB "
             "| MosaicML construct + 1st batch s (peak MB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cold, warm, m = r["tessera_cold"], r["tessera_warm"], r["mosaic"]
        w2, w4 = r["tessera_2_workers"], r["tessera_4_workers"]
        mosaic = m["skipped"] if "skipped" in m else f"{m['construct']:.2f} + {m['first_batch']:.2f} ({m['peak_mb']:.0f})"
        lines.append(
            f"| {r['shards']:,} | {r['index_mb']:.0f} | {r['json_load']['seconds']:.2f} "
            f"| {cold['construct']:.2f} + {cold['first_batch']:.2f} ({cold['peak_mb']:.0f}) "
            f"| {(cold['construct'] + cold['first_batch']) / r['json_load']['seconds']:.2f} "
            f"| {warm['construct'] + warm['first_batch']:.2f} ({warm['peak_mb']:.0f}) "
            f"| {w2['workers_uss_mb']:.0f} ({w2['workers_pss_mb']:.0f}) / {w4['workers_uss_mb']:.0f} "
            f"({w4['workers_pss_mb']:.0f}) | {cold['correct_batches']}/{BATCHES} ({cold['peak_after_100_mb']:.0f}) "
            f"| {r['packed_mb']:.0f} + "
            f"{r['plan_mb']:.0f} | {mosaic} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[50_000, 200_000, 500_000])
    parser.add_argument("--anchor-max", type=int, default=200_000, help="largest shard count MosaicML runs at")
    parser.add_argument("--anchor-timeout", type=float, default=600.0)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, root, real, workers = args.child
        fn = {"json": lambda: child_json(Path(root)), "mosaic": lambda: child_mosaic(Path(root)),
              "tessera": lambda: child_tessera(Path(root), int(real), int(workers))}[kind]
        print(json.dumps(fn()))
        return
    rows = []
    for n in args.shards:
        rows.append(measure(n, args.anchor_max, args.anchor_timeout))
        print(json.dumps(rows[-1]), file=sys.stderr)
    print(table(rows))
    print(json.dumps({"benchmark": "index_scale", "rows": rows}))


if __name__ == "__main__":
    main()
