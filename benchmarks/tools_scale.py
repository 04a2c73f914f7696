"""`tessera data inspect`, `tessera data verify` and `merge_index` on a 488,894-shard index (issue 24).

The index is written without the disk: a few real MDS shards of 1,024 samples each (`tokens` as
ndarray:uint16:32, ~70 KB a shard) and one hard link per index entry (ext4 allows 65,000 links per file),
so every entry names its own file and every file is a real shard. Each shard entry also goes into one of
--parts part indexes (`parts/part-NNNNN/index.json`), the input of `merge_index` as parallel conversion
(Ray, Spark) leaves it; the parts are merged from the local disk and from a SeaweedFS bucket on loopback.

Every figure is one fresh child process (wall time, its peak RSS and its largest worker's), in turn:

- `json.load` of index.json: the floor every reader of the JSON pays;
- `tessera data inspect` and `tessera data verify --index-only` (both read the packed index, packing it
  first: the packed file of the dataset is removed before each run, so every run packs);
- `tessera data verify --quick` (sizes, hashes, headers of every shard) with --workers 1 and 2;
- `merge_index` of the parts, one GET at a time (concurrency 1) and in parallel, local and over S3.

    .venv/bin/python benchmarks/tools_scale.py                       # 488,894 shards, ~2 GB under /tmp
    .venv/bin/python benchmarks/tools_scale.py --shards 50000 --only inspect,verify-index
    .venv/bin/python benchmarks/tools_scale.py --baseline /tmp/old   # `git archive OLD src | tar -x -C /tmp/old`

Prints a table, then one JSON line with every figure. The data folder (--work, default a temp folder
under /tmp) is removed at the end unless --keep.
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

LINKS_PER_FILE = 60_000  # below ext4's 65,000 links per inode
SAMPLES = 1024
COLUMNS = {"tokens": "ndarray:uint16:32"}
FIGURES = ("json-load", "inspect", "verify-index", "verify-quick-1", "verify-quick-2", "merge-local-1",
           "merge-local", "merge-s3-1", "merge-s3")


def write_real_shards(folder: Path, count: int) -> list[dict[str, Any]]:
    """`count` distinct real shards of SAMPLES samples each; their index entries."""
    import numpy as np

    from tessera.shards import ShardWriter

    entries = []
    for k in range(count):
        out = folder / f"real{k}"
        rng = np.random.default_rng(k)
        with ShardWriter(out, COLUMNS, hashes=["xxh64"], size_limit=1 << 30) as writer:
            for row in rng.integers(0, 50_000, (SAMPLES, 32), dtype=np.uint16):
                writer.write({"tokens": row})
        entry = json.loads((out / "index.json").read_text())["shards"][0]
        entry["real"] = str(out / entry["raw_data"]["basename"])
        entries.append(entry)
    return entries


def generate(work: Path, shards: int, parts: int) -> Path:
    """The dataset folder: index.json over `shards` hard-linked entries, and `parts` part indexes."""
    ds = work / "ds"
    if (ds / "index.json").exists():
        return ds
    W = len(str(shards - 1))
    real = write_real_shards(work / "real", -(-shards // LINKS_PER_FILE))
    ds.mkdir(parents=True, exist_ok=True)
    (ds / "parts").mkdir(exist_ok=True)
    per_part = -(-shards // parts)
    texts: list[str] = []
    part_texts: list[str] = []
    for i in range(shards):
        source = real[i // LINKS_PER_FILE]
        name = f"shard.{i:0{W}d}.mds"
        os.link(source["real"], ds / name)
        entry = {k: v for k, v in source.items() if k != "real"}
        entry["raw_data"] = {**entry["raw_data"], "basename": name}
        text = json.dumps(entry, sort_keys=True)
        texts.append(text)
        part_texts.append(text)
        if len(part_texts) == per_part or i == shards - 1:
            folder = ds / "parts" / f"part-{i // per_part:05d}"
            folder.mkdir()
            (folder / "index.json").write_text('{"shards": [' + ", ".join(part_texts) + '], "version": 2}')
            part_texts = []
    tmp = ds / "index.json.tmp"
    tmp.write_text('{"shards": [' + ", ".join(texts) + '], "version": 2}')
    os.replace(tmp, ds / "index.json")
    return ds


# --- one figure per child process ----------------------------------------------------------------------------
def child(spec: dict[str, Any]) -> dict[str, Any]:
    what, ds = spec["what"], Path(spec["ds"])
    try:
        from tessera.shards.packed_index import packed_location
    except ImportError:  # --baseline: a tree from before the packed index
        pass
    else:
        packed_location(ds / "index.json", beside=False).unlink(missing_ok=True)  # every run packs it
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    if what == "json-load":
        with open(ds / "index.json") as f:
            out["shards"] = len(json.load(f)["shards"])
    elif what in ("inspect", "verify-index") or what.startswith("verify-quick"):
        from typer.testing import CliRunner

        from tessera.cli.main import app

        args = {"inspect": ["data", "inspect", str(ds), "--json"],
                "verify-index": ["data", "verify", str(ds), "--index-only"]}.get(what)
        if args is None:
            args = ["data", "verify", str(ds), "--quick", "--workers", what.rsplit("-", 1)[1]]
        res = CliRunner().invoke(app, args)
        out["exit"], out["output"] = res.exit_code, res.output.strip().splitlines()[-1][:200]
    else:
        from tessera.shards.merge import merge_parts

        target = spec.get("url") or str(ds / "parts")
        kwargs = {"concurrency": 1} if what.endswith("-1") else {}
        out["shards"] = len(merge_parts(None, target, **kwargs).shards)
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["workers_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest
    return out


def run_child(spec: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or proc.returncode}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def upload_parts(ds: Path, server: Any) -> str:
    """The part indexes (only they: merge reads nothing else) into a bucket; its URL."""
    from tessera.storage import open_store

    store = open_store("s3://bench/merge")
    for folder in sorted(p for p in (ds / "parts").iterdir() if p.is_dir()):
        store.put(f"{folder.name}/index.json", (folder / "index.json").read_bytes())
    return "s3://bench/merge"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=488_894)
    ap.add_argument("--parts", type=int, default=1000)
    ap.add_argument("--only", default=",".join(FIGURES))
    ap.add_argument("--work", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--baseline", default=None, help="a checkout of another commit: its src/ runs the figures")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tessera-tools-scale-", dir="/tmp"))
    only = args.only.split(",")
    rows: dict[str, Any] = {}
    server = None
    try:
        t0 = time.perf_counter()
        ds = generate(work, args.shards, args.parts)
        size = (ds / "index.json").stat().st_size
        print(f"index of {args.shards:,} shards ({size / 1e6:.0f} MB), {args.parts} parts: "
              f"{time.perf_counter() - t0:.1f} s to generate", file=sys.stderr, flush=True)
        for what in (w for w in FIGURES if w in only):
            spec: dict[str, Any] = {"what": what, "ds": str(ds)}
            env = None
            if what.startswith("merge-s3"):
                if server is None:
                    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
                    import s3server

                    server = s3server.start_server(buckets=("bench",))
                    os.environ.update(server.env())
                    spec_url = upload_parts(ds, server)
                spec["url"] = spec_url
                env = server.env()
            if args.baseline:
                env = {**(env or {}), "PYTHONPATH": str(Path(args.baseline) / "src")}
            rows[what] = run_child(spec, env)
            print(f"  {what}: {rows[what]}", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
            server.cleanup()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.shards:,} shards of {SAMPLES} samples, {args.parts} part indexes")
    print("| figure | seconds | peak RSS (MB) | largest worker (MB) | result |")
    print("|---|---|---|---|---|")
    for what, r in rows.items():
        if "error" in r:
            print(f"| {what} | failed | | {r['error']} |")
            continue
        print(f"| {what} | {r['seconds']:.2f} | {r['peak_rss_mb']:.0f} | {r['workers_peak_rss_mb']:.0f} | "
              f"{r.get('output', r.get('shards', ''))} |")
    print(json.dumps({"benchmark": "tools_scale", "shards": args.shards, "parts": args.parts,
                      "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "rows": rows}))


if __name__ == "__main__":
    main()
