"""Shard writing and random access: Tessera next to mosaicml-streaming and litdata, same data, one run.

Write (samples/s and MB/s of sample bytes, uncompressed and zstd; best of --repeat, writers alternating):
- Tessera `ShardWriter`, one process, fed the same Python samples as MDSWriter.
- Tessera `convert(..., workers=1|2)`: the parallel converter, from a prepared input (prepared outside the
  timed region): tokens as a Parquet file with one 4096-byte binary column per row (ShardWriter stores a
  bytes value of an `ndarray:uint16:2048` column as it is), images as the image folder. Planning the input
  (listing the folder) and starting the worker processes are inside the timed region. Workers read and
  encode whole chunks into shard-ready bytes; the parent cuts shards and compresses/stores them in
  threads. Uniform Parquet rows are encoded column-wise without per-row work, and then the parent does it
  in-line (a process hop would only add a copy), so w=2 takes the w=1 path on the tokens set.
- `streaming.MDSWriter`, one process (it has no parallel writer).
- `litdata.optimize`, 1 and 2 worker processes (spawned, inside the timed region), one input per sample:
  tokens read from the memory-mapped .npy, images from the files.
- jsonl (parse-bound): documents of 200-2,000 characters (text, label, score) as JSONL; MB/s are of the input
  file. ShardWriter and MDSWriter parse each line with `json.loads` in their process (the lines are read
  into RAM outside the timed region); `convert` reads the file. No litdata run (it has no JSONL reader).
Tessera fsyncs every shard and index.json (durable commit); MDSWriter and litdata do not.

Random access: --reads random `ds[i]` (default 100k) on the uncompressed local datasets: Tessera
`tessera.shards.MDSDataset` (and `tessera.stream.StreamingDataset.__getitem__`) vs mosaic's
`StreamingDataset.__getitem__` and litdata's `StreamingDataset.__getitem__`. The anchors are slow, so
they time the first --anchor-reads of the same index list and the figure is scaled to --reads. JPEGs are
not decoded (every reader returns the stored sample lazily or as bytes).

    .venv/bin/python benchmarks/shards.py                      # full size: ~1 GB tokens + 50k images
    .venv/bin/python benchmarks/shards.py --scale 0.1 --only write --workloads tokens
    .venv/bin/python benchmarks/shards.py --work /tmp/shards-data   # keep the generated inputs for reruns

Every write runs in a fresh child process that loads its input before the clock starts (the in-process
writers get the token rows from RAM; spawned workers of convert and litdata re-import only this light
script, not the anchors).

Prints tables, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import workloads as W

COMPRESSIONS = (None, "zstd")
JSONL_FULL = 800_000  # documents of 200-2,000 characters: ~0.9 GB of JSONL
JSONL_COLUMNS = {"text": "str", "label": "int", "score": "float64"}
WRITERS = ("tessera ShardWriter", "tessera convert w=1", "tessera convert w=2", "mosaic MDSWriter")


def slug(name: str) -> str:
    return name.replace(" ", "_").replace("=", "")


def run_writer(workload: str, writer: str, compression: str | None, out: Path, work: Path, samples: int) -> float:
    """In a fresh process (see `child_write`): load the input outside the timed region, write, return seconds."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-write", workload, writer, compression or "none",
           str(out), str(work), str(samples)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{writer} on {workload} failed:\n{proc.stderr[-4000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def child_write(workload: str, writer: str, compression: str | None, out: Path, work: Path, samples: int) -> None:
    """Child process body: the main module stays light, because spawned workers (convert, litdata) re-import it."""
    from tessera.shards.convert import convert

    if workload == "tokens":
        npy, parquet = work / "tokens.npy", work / "tokens.parquet"
        tokens = W.load_tokens(npy) if writer in ("tessera ShardWriter", "mosaic MDSWriter") else None
        assert tokens is None or tokens.shape[0] == samples
        fns = {"tessera ShardWriter": lambda: W.tessera_write_tokens(out, tokens, compression),
               "mosaic MDSWriter": lambda: W.mds_write_tokens(out, tokens, compression)}
        for n in (1, 2):
            fns[f"tessera convert w={n}"] = lambda n=n: convert(parquet, out, fmt="parquet", columns=W.TOKEN_COLUMNS,
                                                                compression=compression, size_limit=W.SIZE_LIMIT,
                                                                workers=n)
            fns[f"litdata optimize w={n}"] = lambda n=n: W.litdata_write(out, W.TokenRow(str(npy)),
                                                                         list(range(samples)), compression, n)
    elif workload == "jsonl":
        path = work / "docs.jsonl"
        lines = path.read_bytes().splitlines() if writer in ("tessera ShardWriter", "mosaic MDSWriter") else []
        fns = {"tessera ShardWriter": lambda: tessera_write_jsonl(out, lines, compression),
               "mosaic MDSWriter": lambda: mds_write_jsonl(out, lines, compression)}
        for n in (1, 2):
            fns[f"tessera convert w={n}"] = lambda n=n: convert(path, out, columns=JSONL_COLUMNS, compression=compression,
                                                                size_limit=W.SIZE_LIMIT, workers=n)
    else:
        files = W.make_images(work, samples)
        fns = {"tessera ShardWriter": lambda: W.tessera_write_images(out, files, compression),
               "mosaic MDSWriter": lambda: W.mds_write_images(out, files, compression)}
        for n in (1, 2):
            fns[f"tessera convert w={n}"] = lambda n=n: convert(work / "images", out, fmt="images",
                                                                compression=compression, size_limit=W.SIZE_LIMIT,
                                                                workers=n)
            fns[f"litdata optimize w={n}"] = lambda n=n: W.litdata_write(out, W.lit_image, files, compression, n)
    if writer == "mosaic MDSWriter":
        W.mosaic()  # import streaming outside the timed region
    if writer.startswith("litdata"):
        import litdata  # noqa: F401  (the import is not the writer's work; its workers' imports are)
    t0 = time.perf_counter()
    fns[writer]()
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def make_jsonl(work: Path, n: int, seed: int = 0) -> Path:
    """`docs.jsonl`: n documents of random words (text, label, score), reused when it has n lines."""
    path, stamp = work / "docs.jsonl", work / "docs.jsonl.complete"
    if path.exists() and stamp.exists() and stamp.read_text() == f"{n}:{seed}":
        return path
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    with open(path, "w") as f:
        for i in range(n):
            text = " ".join(rng.choices(words, k=rng.randint(30, 300)))
            f.write(json.dumps({"text": text, "label": i % 10, "score": rng.random()}) + "\n")
    stamp.write_text(f"{n}:{seed}")
    return path


def tessera_write_jsonl(out: Path, lines: list[bytes], compression: str | None) -> None:
    """One process: parse each line and write it, as a script using ShardWriter would."""
    from tessera.shards import ShardWriter

    with ShardWriter(out, JSONL_COLUMNS, compression=compression, size_limit=W.SIZE_LIMIT) as writer:
        for line in lines:
            writer.write(json.loads(line))


def mds_write_jsonl(out: Path, lines: list[bytes], compression: str | None) -> None:
    with W.mosaic().MDSWriter(out=str(out), columns=JSONL_COLUMNS, compression=compression,
                              size_limit=W.SIZE_LIMIT) as writer:
        for line in lines:
            writer.write(json.loads(line))


def bench_write(workload: str, data: dict[str, Any], work: Path, repeat: int, lit_workers: list[int],
                rows: list[dict[str, Any]], only_writers: list[str] | None = None) -> None:
    writers = [*WRITERS, *(f"litdata optimize w={n}" for n in lit_workers if workload != "jsonl")]
    if only_writers:
        writers = [w for w in writers if any(key in w for key in only_writers)]
        if "mosaic MDSWriter" not in writers:
            writers.append("mosaic MDSWriter")  # the baseline of the x column
    n, raw = data["samples"], data["raw_bytes"]
    for compression in COMPRESSIONS:
        best: dict[str, float] = {}
        stored: dict[str, int] = {}
        for _ in range(repeat):
            for name in writers:
                out = work / "out" / workload / f"{slug(name)}-{compression}"
                W.rm(out)
                dt = run_writer(workload, name, compression, out, work, n)
                best[name] = min(best.get(name, float("inf")), dt)
                stored[name] = W.dir_bytes(out)
                print(f"  [{workload} {compression or 'none'}] {name}: {dt:.2f}s", file=sys.stderr, flush=True)
        base = best["mosaic MDSWriter"]
        for name in writers:
            rows.append({"workload": workload, "compression": compression or "none", "writer": name,
                         "seconds": best[name], "samples_per_s": n / best[name], "mb_per_s": raw / 1e6 / best[name],
                         "stored_mb": stored[name] / 1e6, "x_mdswriter": base / best[name]})


def dataset_dirs(workload: str, data: dict[str, Any], work: Path) -> dict[str, Path]:
    """The uncompressed datasets the write section produced (written now if it did not run)."""
    root = work / "out" / workload
    names = {"tessera": "tessera ShardWriter", "mosaic": "mosaic MDSWriter", "litdata": "litdata optimize w=2"}
    dirs = {}
    for lib, writer in names.items():
        dirs[lib] = root / f"{slug(writer)}-None"
        if not (dirs[lib] / "index.json").exists():
            W.rm(dirs[lib])
            run_writer(workload, writer, None, dirs[lib], work, data["samples"])
    return dirs


def time_reads(ds: Any, indices: list[int]) -> float:
    ds[indices[0]]  # open the first shard outside the timed region
    t0 = time.perf_counter()
    for i in indices:
        ds[i]
    return time.perf_counter() - t0


def bench_random(workload: str, data: dict[str, Any], work: Path, reads: int, anchor_reads: int,
                 rows: list[dict[str, Any]]) -> None:
    import litdata

    import tessera.stream
    from tessera.shards import MDSDataset

    anchors = W.mosaic()

    dirs = dataset_dirs(workload, data, work)
    n = data["samples"]
    rng = random.Random(1)
    indices = [rng.randrange(n) for _ in range(reads)]
    subset = indices[:min(reads, anchor_reads)]
    results = []

    ds = MDSDataset(dirs["tessera"])
    results.append(("tessera MDSDataset", time_reads(ds, indices), len(indices)))
    del ds
    ds = tessera.stream.StreamingDataset(local=str(dirs["tessera"]), batch_size=1)
    results.append(("tessera stream.StreamingDataset", time_reads(ds, indices), len(indices)))
    del ds
    anchors.clean_stale_shared_memory()
    ds = anchors.StreamingDataset(local=str(dirs["mosaic"]), remote=None, shuffle=False, batch_size=1)
    results.append(("mosaic StreamingDataset", time_reads(ds, subset), len(subset)))
    del ds
    anchors.clean_stale_shared_memory()
    cache = work / "litdata-cache"
    W.rm(cache)
    ds = litdata.StreamingDataset(str(dirs["litdata"]), cache_dir=str(cache))
    results.append(("litdata StreamingDataset", time_reads(ds, subset), len(subset)))
    del ds
    W.rm(cache)
    base = next(t / k for name, t, k in results if name == "mosaic StreamingDataset")
    for name, seconds, k in results:
        per = seconds / k
        rows.append({"workload": workload, "reader": name, "reads_timed": k, "seconds_per_100k": per * 1e5,
                     "reads_per_s": 1 / per, "us_per_read": per * 1e6, "x_mosaic": base / per})


def prepare(workload: str, scale: float, work: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    if workload == "jsonl":
        n = W.scaled(JSONL_FULL, scale)
        path = make_jsonl(work, n)
        data = {"samples": n, "raw_bytes": path.stat().st_size}
    elif workload == "tokens":
        n = W.scaled(W.TOKENS_FULL, scale)
        npy = W.make_tokens(work, n)
        parquet = W.write_parquet_tokens(npy, work / "tokens.parquet")
        data = {"samples": n, "npy": npy, "parquet": parquet, "raw_bytes": n * W.SEQ * 2}
    else:
        n = W.scaled(W.IMAGES_FULL, scale)
        files = W.make_images(work, n)
        data = {"samples": n, "files": files, "folder": work / "images",
                "raw_bytes": W.image_bytes(files) + 8 * n}
    print(f"  prepared {workload}: {data['samples']:,} samples, {data['raw_bytes'] / 1e6:.0f} MB "
          f"({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full workloads (1 GB tokens, 50k images)")
    ap.add_argument("--only", default="write,random", help="sections: write, random")
    ap.add_argument("--workloads", default="tokens,images,jsonl")
    ap.add_argument("--repeat", type=int, default=1, help="write runs per writer (best is kept)")
    ap.add_argument("--reads", type=int, default=100_000)
    ap.add_argument("--anchor-reads", type=int, default=20_000, help="reads timed for the anchors (scaled)")
    ap.add_argument("--writers", default=None, help="comma list of substrings selecting writers (e.g. 'tessera')")
    ap.add_argument("--lit-workers", default="1,2", help="litdata.optimize worker counts")
    ap.add_argument("--work", default=None, help="data folder (kept, and reused by later runs); default: temp, removed")
    ap.add_argument("--child-write", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_write:
        workload, writer, compression, out, work, samples = args.child_write
        child_write(workload, writer, None if compression == "none" else compression, Path(out), Path(work),
                    int(samples))
        return
    sections = set(args.only.split(","))
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tessera-bench-shards-"))
    work.mkdir(parents=True, exist_ok=True)
    write_rows: list[dict[str, Any]] = []
    read_rows: list[dict[str, Any]] = []
    try:
        for workload in args.workloads.split(","):
            data = prepare(workload, args.scale, work)
            if "write" in sections:
                bench_write(workload, data, work, args.repeat, [int(x) for x in args.lit_workers.split(",")],
                            write_rows, args.writers.split(",") if args.writers else None)
            if "random" in sections and workload != "jsonl":
                bench_random(workload, data, work, args.reads, args.anchor_reads, read_rows)
            W.rm(work / "out" / workload)
            data.clear()
    finally:
        if not args.work:
            W.rm(work)
    if write_rows:
        W.print_table(f"Write (best of {args.repeat})",
                      ["workload", "compr.", "writer", "s", "samples/s", "MB/s", "stored MB", "x MDSWriter"],
                      [[r["workload"], r["compression"], r["writer"], r["seconds"], r["samples_per_s"],
                        r["mb_per_s"], r["stored_mb"], f"x{r['x_mdswriter']:.2f}"] for r in write_rows])
    if read_rows:
        W.print_table(f"Random access: {args.reads:,} random ds[i] (anchors timed on {args.anchor_reads:,}, scaled)",
                      ["workload", "reader", "s / 100k", "reads/s", "us/read", "x mosaic"],
                      [[r["workload"], r["reader"], r["seconds_per_100k"], r["reads_per_s"], r["us_per_read"],
                        f"x{r['x_mosaic']:.1f}"] for r in read_rows])
    W.dump_json({"benchmark": "shards", "scale": args.scale, "repeat": args.repeat, "cpus": os.cpu_count(),
                 "load_avg": os.getloadavg(), "write": write_rows, "random_access": read_rows})


if __name__ == "__main__":
    main()
