"""Time to the first batch of a cold remote epoch of a zstd-compressed dataset: Tessera next to
mosaicml-streaming.

The tokens workload of stream.py (~1 GB of 2048-token uint16 samples at --scale 1) written with zstd by each
library's own writer (64 MiB raw shards), in a SeaweedFS bucket on loopback. Each run is a fresh child
process with an empty cache folder: construct the dataset (index download included), start a DataLoader
with 2 workers, batch 64, and time until the first batch arrives; shuffle off and on (each library's
default shuffle otherwise). A compressed shard cannot be read by range, so the first batch waits for the
whole shards it needs, downloaded and decompressed. Median of --repeat runs.

    .venv/bin/python benchmarks/first_batch.py
    .venv/bin/python benchmarks/first_batch.py --scale 0.25 --repeat 5

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import stream as S
import workloads as W

LIBS = ("tessera", "mosaic")


def child(spec: dict[str, Any]) -> dict[str, Any]:
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    anchors = W.mosaic()
    lib, cache = spec["lib"], Path(spec["cache"])
    t0 = time.perf_counter()
    if lib == "tessera":
        from tessera.stream import StreamingDataset

        ds = StreamingDataset(remote=spec["url"], local=str(cache), shuffle=spec["shuffle"], batch_size=S.BATCH)
    else:
        anchors.clean_stale_shared_memory()
        ds = anchors.StreamingDataset(remote=spec["url"], local=str(cache), shuffle=spec["shuffle"],
                                      batch_size=S.BATCH)
    loader = S.loader(lib, ds, "tokens", S.WORKERS)
    it = iter(loader)
    batch = next(it)
    first = time.perf_counter() - t0
    n = S.batch_len(batch)
    del it, loader
    return {"first_batch_s": first, "samples": n}


def write(data_dir: Path, n: int, work: Path) -> dict[str, Path]:
    tokens = W.load_tokens(W.make_tokens(work, n))
    dirs = {lib: data_dir / lib for lib in LIBS}
    for lib, out in dirs.items():
        if not (out / "index.json").exists():
            (W.tessera_write_tokens if lib == "tessera" else W.mds_write_tokens)(out, tokens, "zstd")
    return dirs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a first batch")
    parsed = W.bench_args(ap, child, "tessera-bench-first-batch-")
    if parsed is None:
        return
    args, work = parsed
    env = S.Env(work)
    rows = []
    try:
        n = W.scaled(W.TOKENS_FULL, args.scale)
        dirs = write(work / "zstd", n, work)
        env.start_server()
        client = env.server.boto3_client()
        urls = {}
        for lib, root in dirs.items():
            for path in sorted(root.iterdir()):
                client.upload_file(str(path), "bench", f"zstd/{lib}/{path.name}")
            urls[lib] = f"s3://bench/zstd/{lib}"
        os.sync()
        for shuffle in (False, True):
            for lib in LIBS:
                times = []
                for _ in range(args.repeat):
                    cache = env.cache()
                    spec = {"lib": lib, "url": urls[lib], "shuffle": shuffle, "cache": str(cache)}
                    try:
                        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                                              capture_output=True, text=True, timeout=args.timeout)
                    except subprocess.TimeoutExpired:
                        print(f"  {lib} shuffle={shuffle}: no first batch in {args.timeout:.0f} s", file=sys.stderr)
                        times.append(float("inf"))
                        continue
                    finally:
                        W.rm(cache)
                        W.mosaic().clean_stale_shared_memory()
                    if proc.returncode == 0:
                        times.append(json.loads(proc.stdout.strip().splitlines()[-1])["first_batch_s"])
                    else:
                        print(f"  {lib} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                row = {"lib": lib, "shuffle": shuffle, "runs": times,
                       "median_s": statistics.median(times) if times else None}
                rows.append(row)
                print(f"  {row}", file=sys.stderr, flush=True)
    finally:
        env.close()
        if not args.work:
            W.rm(work)
    shards = len(list(dirs["tessera"].glob("*.zstd"))) if args.work else None
    print(f"\nCold remote zstd dataset ({n:,} samples), DataLoader w={S.WORKERS}: time to first batch, median of "
          f"{args.repeat}")
    print("| library | shuffle | first batch (s) | runs |")
    print("|---|---|---|---|")
    for r in rows:
        med = f"{r['median_s']:.3f}" if r["median_s"] is not None else "failed"  # inf: none within --timeout
        print(f"| {r['lib']} | {r['shuffle']} | {med} | {', '.join(f'{t:.2f}' for t in r['runs'])} |")
    W.dump_json({"benchmark": "first_batch", "scale": args.scale, "samples": n, "shards": shards,
                 "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "rows": rows})


if __name__ == "__main__":
    main()
