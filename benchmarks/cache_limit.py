"""A remote epoch under a bounded cache: Tessera next to mosaicml-streaming and litdata.

The tokens workload of stream.py (~1 GB of 2048-token uint16 samples, 64 MiB shards/chunks, each library's
own format) in a SeaweedFS bucket on loopback. Each run is a fresh child process with an empty cache folder
reading one whole shuffled epoch (each library's default shuffle) through a DataLoader with 2 workers, batch
64: once with no cache limit and once with the limit at --share of the dataset (25% by default) given to
each library (Tessera and mosaic `cache_limit`, litdata `max_cache_size`, with batch_decode="all", its fastest remote setting: stream.py). Tessera also
runs unshuffled; mosaic, which refuses limits under 4x its largest shard, also runs at that minimum.

Figures per run: samples/s over the epoch, the rate relative to the same library's unbounded run, shard
downloads (Tessera: its cache's download journal; the others: a thread polling the cache folder every 5 ms
that counts shard files appearing, so a download evicted within 5 ms goes unseen: a lower bound), the most
downloads of one shard, and the peak bytes in the cache folder. A run that fails (a library refusing the
limit, say) is reported with its error. --time-cap stops an epoch early (then marked partial).

    .venv/bin/python benchmarks/cache_limit.py                     # 1 GB, 25% limit
    .venv/bin/python benchmarks/cache_limit.py --scale 0.25 --share 0.5 --libs tessera,mosaic

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import stream as S
import workloads as W

SHARD_SUFFIX = {"tessera": ".mds", "mosaic": ".mds", "litdata": ".bin"}


class CacheWatch(W.PeriodicSampler):
    """Polls a cache folder: shard files appearing (downloads seen) and the peak bytes of all files."""

    def __init__(self, root: Path, suffix: str, interval: float = 0.005) -> None:
        super().__init__(interval)
        self.root, self.suffix = root, suffix
        self.appeared: Counter[str] = Counter()
        self.peak_bytes = 0
        self._present: set[str] = set()

    def sample(self) -> None:
        now, total = set(), 0
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                try:
                    total += os.stat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    continue
                if name.endswith(self.suffix) and not name.startswith("."):
                    now.add(name)
        self.appeared.update(now - self._present)
        self._present, self.peak_bytes = now, max(self.peak_bytes, total)


def make_dataset(lib: str, url: str, cache: Path, limit: int | None, shuffle: bool) -> Any:
    if lib == "tessera":
        from tessera.stream import StreamingDataset

        return StreamingDataset(remote=url, local=str(cache), shuffle=shuffle, batch_size=S.BATCH, cache_limit=limit)
    if lib == "mosaic":
        anchors = W.mosaic()
        anchors.clean_stale_shared_memory()
        return anchors.StreamingDataset(remote=url, local=str(cache), shuffle=shuffle, batch_size=S.BATCH,
                                        cache_limit=limit)
    import litdata

    S.Env.litdata_allow_http()
    extra = {"max_cache_size": limit} if limit else {}
    return litdata.StreamingDataset(url, cache_dir=str(cache), shuffle=shuffle, storage_options=S.s3_options(),
                                    batch_decode="all", **extra)


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One epoch in this (fresh) process; its figures."""
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    W.mosaic()
    import litdata  # noqa: F401  (imported before timing, as every library)

    lib, cache = spec["lib"], Path(spec["cache"])
    t0 = time.perf_counter()
    ds = make_dataset(lib, spec["url"], cache, spec["limit"], spec["shuffle"])
    loader = S.loader(lib, ds, "tokens", S.WORKERS)
    n, partial = 0, False
    with CacheWatch(cache, SHARD_SUFFIX[lib]) as watch:
        t_start = time.perf_counter()
        for batch in loader:
            n += S.batch_len(batch)
            if time.perf_counter() - t_start > spec["time_cap"]:
                partial = True
                break
        seconds = time.perf_counter() - t_start
        del loader
    if lib == "tessera":
        from tessera.stream import download_counts

        downloads = download_counts(cache)
    else:
        downloads = watch.appeared
    return {"samples": n, "seconds": seconds, "samples_per_s": n / seconds, "build_s": t_start - t0,
            "partial": partial, "downloads": sum(downloads.values()), "shards_seen": len(downloads),
            "max_downloads_per_shard": max(downloads.values(), default=0), "peak_cache_mb": watch.peak_bytes / 1e6}


def run_child(env: S.Env, spec: dict[str, Any], attempts: int = 2) -> dict[str, Any]:
    """One run in a fresh process with an empty cache; a failed run is tried once more (mosaic's shared
    memory coordination sometimes reads a shard too early on this loaded machine, as stream.py notes)."""
    error = ""
    for _ in range(attempts):
        cache = env.cache()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps({**spec, "cache": str(cache)})]
        try:  # a library that stops making progress (no batch comes) is stopped past the cap
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=spec["time_cap"] + 120)
        except subprocess.TimeoutExpired:
            W.rm(cache)
            return {"error": f"no progress: stopped after {spec['time_cap'] + 120:.0f} s (hung)"}
        W.rm(cache)
        os.sync()
        W.mosaic().clean_stale_shared_memory()
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith(" ")]
        error = (lines[-1] if lines else f"exit code {proc.returncode}")[:240]
        if "too low" in error or "below twice" in error:  # a refused limit: no use trying again
            break
    return {"error": error}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the 1 GB tokens workload")
    ap.add_argument("--share", type=float, default=0.25, help="cache limit as a share of the dataset's bytes")
    ap.add_argument("--libs", default="tessera,mosaic,litdata")
    ap.add_argument("--time-cap", type=float, default=300.0, help="seconds after which an epoch is cut short")
    parsed = W.bench_args(ap, child, "tessera-bench-cache-limit-")
    if parsed is None:
        return
    args, work = parsed
    env = S.Env(work)
    rows: list[dict[str, Any]] = []
    try:
        data = S.prepare("tokens", args.scale, work)
        urls = env.upload(data)
        dataset_bytes = sum(f.stat().st_size for f in data["dirs"]["tessera"].glob("*.mds"))
        limit = int(args.share * dataset_bytes)
        largest = max(f.stat().st_size for f in data["dirs"]["mosaic"].glob("*.mds"))
        runs = [(lib, True) for lib in args.libs.split(",")] + [("tessera", False)] * ("tessera" in args.libs)
        for lib, shuffle in runs:
            # mosaic refuses limits under 4x its largest shard: also run it at that, its smallest limit
            extra = [4 * largest] if lib == "mosaic" and limit < 4 * largest else []
            for bound in (None, limit, *extra):
                spec = {"lib": lib, "url": urls[lib], "limit": bound, "shuffle": shuffle, "time_cap": args.time_cap}
                result = run_child(env, spec)
                rows.append({"lib": lib, "shuffle": shuffle, "cache_limit": bound, **result})
                print(f"  {lib} shuffle={shuffle} limit={bound}: {result}", file=sys.stderr, flush=True)
    finally:
        env.close()
        if not args.work:
            W.rm(work)
    for row in rows:
        free = next((r for r in rows if r["lib"] == row["lib"] and r["shuffle"] == row["shuffle"]
                     and r["cache_limit"] is None and "error" not in r), None)
        if "error" not in row and free:
            row["vs_unbounded"] = row["samples_per_s"] / free["samples_per_s"]
    report(rows, limit, dataset_bytes, args)
    W.dump_json({"benchmark": "cache_limit", "scale": args.scale, "share": args.share, "cache_limit": limit,
                 "dataset_bytes": dataset_bytes, "batch_size": S.BATCH, "workers": S.WORKERS,
                 "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "rows": rows})


def report(rows: list[dict[str, Any]], limit: int, dataset_bytes: int, args: argparse.Namespace) -> None:
    print(f"\nRemote tokens epoch, DataLoader w={S.WORKERS}, batch {S.BATCH}: cache limit {limit / 1e6:.0f} MB "
          f"= {args.share:.0%} of {dataset_bytes / 1e6:.0f} MB")
    print(f"| {'library':8} | {'shuffle':7} | {'cache limit':11} | {'samples/s':>9} | {'vs no limit':>11} | "
          f"{'downloads':>9} | {'max/shard':>9} | {'peak cache MB':>13} |")
    print("|" + "|".join("-" * (w + 2) for w in (8, 7, 11, 9, 11, 9, 9, 13)) + "|")
    for r in rows:
        bound = "none" if r["cache_limit"] is None else f"{r['cache_limit'] / 1e6:.0f} MB"
        if "error" in r:
            print(f"| {r['lib']:8} | {str(r['shuffle']):7} | {bound:11} | error: {r['error']}")
            continue
        rate = f"{r['samples_per_s']:,.0f}" + ("*" if r["partial"] else "")
        rel = f"{r['vs_unbounded']:.2f}x" if "vs_unbounded" in r else "-"
        print(f"| {r['lib']:8} | {str(r['shuffle']):7} | {bound:11} | {rate:>9} | {rel:>11} | {r['downloads']:>9} | "
              f"{r['max_downloads_per_shard']:>9} | {r['peak_cache_mb']:>13,.0f} |")
    print("(* epoch cut short by --time-cap; mosaic and litdata downloads are polled: a lower bound)")


if __name__ == "__main__":
    main()
