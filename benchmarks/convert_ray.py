"""Conversion at cluster scale: `convert --workers 2` here vs `--engine ray` with 2 worker processes vs
MosaicML's MDSWriter in one process, on the same JSONL and Parquet inputs; Ray's overhead per shard and
per task; a paper projection of MPT-30B's pre-training set (32.8 TB) on 64 nodes.

    .venv/bin/python benchmarks/convert_ray.py [--size 200] [--workers 2] [--cores-per-node 32]

Ray runs as a local instance of `--workers` CPUs, started once before the timed runs (its start-up is
reported apart: a cluster is started once for many conversions). Outputs are checked to hold the same
samples in the same order. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tests_shared import tests_module

from tessera.shards import MDSDataset
from tessera.shards.convert import convert
from tessera.shards.ray_engine import convert_on_ray

anchors = tests_module("anchors")  # torchvision stand-in, then `import streaming`

MPT_BYTES = 32.8e12  # MPT-30B pre-training set, decompressed
MPT_SHARDS = 488_894
INDEX_GET_S = 0.02  # projection: one GET of a part's small index.json from a bucket (latency-bound)
INDEX_ENTRY_BYTES = 420  # projection: one shard's index entry (two columns, zstd, part-prefixed names; 296 raw)
COLUMNS = {"id": "int64", "text": "str"}


def make_inputs(folder: Path, megabytes: int) -> tuple[Path, Path, int]:
    """A JSONL file of ~`megabytes` MB of ~1 KB documents, and the same rows as Parquet (8 MB row groups)."""
    jsonl, parquet = folder / "in.jsonl", folder / "in.parquet"
    rng = np.random.default_rng(0)
    vocab = np.array(["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), int(n))) for n in rng.integers(2, 10, 5000)])
    rows, size = 0, 0
    texts: list[str] = []
    with jsonl.open("w") as f:
        while size < megabytes * 1e6:
            text = " ".join(vocab[rng.integers(0, len(vocab), 150 + rows % 50)])
            line = json.dumps({"id": rows, "text": text}) + "\n"
            f.write(line)
            texts.append(text)
            size += len(line)
            rows += 1
    table = pa.table({"id": pa.array(range(rows), pa.int64()), "text": texts})
    pq.write_table(table, parquet, row_group_size=8000)
    return jsonl, parquet, rows


def mosaic_writer(source: Path, out: Path) -> None:
    """What a user of MosaicML Streaming writes by hand: read the rows, MDSWriter.write each."""
    with anchors.MDSWriter(out=str(out), columns=COLUMNS) as writer:
        if source.suffix == ".jsonl":
            with source.open() as f:
                for line in f:
                    writer.write(json.loads(line))
        else:
            parquet = pq.ParquetFile(source)
            for group in range(parquet.num_row_groups):
                for row in parquet.read_row_group(group).to_pylist():
                    writer.write(row)


def timed(fn, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    fn(out)
    return time.perf_counter() - start


def same_samples(a: Path, b: Path, stride: int = 997) -> bool:
    x, y = MDSDataset(str(a)), MDSDataset(str(b))
    return len(x) == len(y) and all(x[i] == y[i] for i in range(0, len(x), stride))


def task_overhead(ray, tasks: int = 200) -> float:
    """Seconds per empty Ray task, submitted `tasks` at a time and awaited (scheduling + round trip)."""
    noop = ray.remote(num_cpus=1)(lambda: None)
    ray.get([noop.remote() for _ in range(20)])  # warm the workers
    start = time.perf_counter()
    ray.get([noop.remote() for _ in range(tasks)])
    return (time.perf_counter() - start) / tasks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=200, help="MB of JSONL input (the Parquet has the same rows)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores-per-node", type=int, default=32, help="projection: worker processes per node")
    parser.add_argument("--node-gbps", type=float, default=10.0, help="projection: network per node, Gbit/s")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    work = Path(tempfile.mkdtemp(prefix="tessera-convert-ray-"))
    import ray

    try:
        jsonl, parquet, rows = make_inputs(work, args.size)
        start = time.perf_counter()
        ray.init(address="local", num_cpus=args.workers, include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)
        ray_start = time.perf_counter() - start
        per_task = task_overhead(ray)
        results = {}
        for name, source in (("jsonl", jsonl), ("parquet", parquet)):
            local = timed(lambda out, s=source: convert(s, out, workers=args.workers), work / f"{name}-local")
            # rates in MB of samples (the MDS raw bytes): the Parquet file itself is compressed
            megabytes = sum(e.raw_data.bytes for e in MDSDataset(str(work / f"{name}-local")).index.shards) / 1e6
            summary = {}

            def on_ray(out: Path, s: Path = source) -> None:
                summary["ray"] = convert_on_ray(s, out, workers=args.workers)

            on_ray_s = timed(on_ray, work / f"{name}-ray")
            mosaic = timed(lambda out, s=source: mosaic_writer(s, out), work / f"{name}-mosaic")
            shards = summary["ray"].shards
            assert same_samples(work / f"{name}-local", work / f"{name}-ray")
            assert same_samples(work / f"{name}-local", work / f"{name}-mosaic")
            results[name] = {"input_mb": round(source.stat().st_size / 1e6, 1), "sample_mb": round(megabytes, 1), "samples": rows, "local_s": round(local, 2),
                             "ray_s": round(on_ray_s, 2), "mosaic_s": round(mosaic, 2),
                             "parts": summary["ray"].extra["parts"], "ray_shards": shards,
                             "local_mb_s": round(megabytes / local, 1), "ray_mb_s": round(megabytes / on_ray_s, 1),
                             "mosaic_mb_s": round(megabytes / mosaic, 1),
                             "ray_overhead_per_shard_s": round((on_ray_s - local) / shards, 3)}
        ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # Projection: every worker process converts at the per-process rate measured on Ray here (JSONL, the
    # slower input), capped by each node's network (reading the input and writing the shards both cross it).
    per_process = min(r["ray_mb_s"] for r in results.values()) / args.workers  # MB/s per worker process
    node_cpu = per_process * args.cores_per_node
    node_net = args.node_gbps * 1e3 / 8 / 2  # MB/s each way: read + write share the link
    node_rate = min(node_cpu, node_net)
    hours = MPT_BYTES / 1e6 / (node_rate * 64) / 3600
    parts = int(MPT_BYTES / 1e9)  # ~1 GB parts (256 chunks of 4 MB)
    projection = {"nodes": 64, "cores_per_node": args.cores_per_node, "per_process_mb_s": round(per_process, 1),
                  "node_mb_s": round(node_rate, 1), "bound": "cpu" if node_cpu < node_net else "network",
                  "hours": round(hours, 2), "tasks_of_1gb": parts, "shards": MPT_SHARDS,
                  "merge_minutes": round(parts * INDEX_GET_S / 60, 1),  # the driver reads every part's index
                  "merged_index_mb": round(MPT_SHARDS * INDEX_ENTRY_BYTES / 1e6)}
    print(f"{'input':8} {'file MB':>7} {'local x' + str(args.workers):>12} {'ray x' + str(args.workers):>12} "
          f"{'MDSWriter x1':>13} {'parts':>6} {'ray ovh/shard':>14}")
    for name, r in results.items():
        print(f"{name:8} {r['input_mb']:7.1f} {r['local_s']:8.2f}s ({r['local_mb_s']:5.1f} MB/s) "
              f"{r['ray_s']:6.2f}s ({r['ray_mb_s']:5.1f}) {r['mosaic_s']:7.2f}s ({r['mosaic_mb_s']:5.1f}) "
              f"{r['parts']:6} {r['ray_overhead_per_shard_s']:13.3f}s")
    print(f"ray start-up {ray_start:.1f}s (once per cluster); an empty task costs {per_task * 1e3:.1f} ms")
    print(f"projection: 32.8 TB on 64 nodes x {args.cores_per_node} processes at {per_process:.1f} MB/s each, "
          f"{projection['bound']}-bound at {node_rate:,.0f} MB/s per node: {hours:.1f} h, then the merge reads "
          f"{parts:,} part indexes (~{projection['merge_minutes']} min at {INDEX_GET_S * 1e3:.0f} ms each) and writes "
          f"a {projection['merged_index_mb']} MB index.json")
    print(json.dumps({"results": results, "ray_start_s": round(ray_start, 2), "ray_task_ms": round(per_task * 1e3, 2),
                      "projection": projection}))


if __name__ == "__main__":
    main()
