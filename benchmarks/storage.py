"""GET and PUT throughput against SeaweedFS on loopback: Tessera next to single-stream boto3.

MosaicML Streaming downloads each shard with `download_file(..., Config=TransferConfig(use_threads=False))`,
one GET stream per object; that is the baseline here, run in the same process on the same objects.

    .venv/bin/python benchmarks/storage.py [--sizes 1,16,256] [--repeats 3]

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from boto3.s3.transfer import TransferConfig
from tests_shared import tests_module

from tessera.storage import download, open_store

SINGLE = TransferConfig(use_threads=False)


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` runs."""
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds per named function, run in turns (a, b, a, b, ...) so both see the same noise."""
    runs: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - t0)
    return {name: statistics.median(times) for name, times in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1,16,256", help="object sizes in MiB")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = tests_module("s3server").start_server(buckets=("bench",))
    results = []
    try:
        os.environ.update(server.env())
        store = open_store("s3://bench/objects")
        boto = server.boto3_client()
        with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
            for mib in sizes:
                src = Path(tmp) / f"src-{mib}.bin"
                src.write_bytes(os.urandom(mib << 20))
                key = f"obj-{mib}"
                out = Path(tmp) / "out.bin"
                row = {"size_mib": mib}
                store.put_file(key, src)  # warm both clients' connection pools before timing
                boto.upload_file(str(src), "bench", f"objects/{key}-b", Config=SINGLE)
                puts = interleaved({
                    "tessera": lambda: store.put_file(key, src),
                    "boto3": lambda: boto.upload_file(str(src), "bench", f"objects/{key}-b", Config=SINGLE),
                }, args.repeats)
                # The PUTs above leave GBs of dirty pages (the server's volume files) that the kernel
                # flushes for seconds; timing GETs during that flush measures the disk, not the client.
                os.sync()
                time.sleep(1.0)
                gets = interleaved({
                    "tessera": lambda: download(store.url_for(key), out),
                    "boto3": lambda: boto.download_file("bench", f"objects/{key}-b", str(out), Config=SINGLE),
                }, args.repeats)
                row["tessera_put"], row["boto3_put"] = mib / puts["tessera"], mib / puts["boto3"]
                row["tessera_get"], row["boto3_get"] = mib / gets["tessera"], mib / gets["boto3"]
                row["get_speedup"] = row["tessera_get"] / row["boto3_get"]
                results.append(row)
                src.unlink()
    finally:
        server.stop()
    header = f"{'size':>8} | {'PUT tessera':>12} | {'PUT boto3':>10} | {'GET tessera':>12} | {'GET boto3':>10} | {'GET x':>6}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['size_mib']:>5} MiB | {r['tessera_put']:>7.0f} MB/s | {r['boto3_put']:>5.0f} MB/s | "
              f"{r['tessera_get']:>7.0f} MB/s | {r['boto3_get']:>5.0f} MB/s | {r['get_speedup']:>5.2f}x")
    print(json.dumps({"benchmark": "storage", "unit": "MiB/s", "repeats": args.repeats, "results": results}))


if __name__ == "__main__":
    main()
