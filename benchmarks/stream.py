"""Streaming: Tessera next to mosaicml-streaming and litdata, side by side in one run.

Workloads (benchmarks/workloads.py): (a) tokens, ~1 GB of 2048-token uint16 samples; (b) images, 50k 32x32
JPEG + int label. Each library reads the same samples written in its own format (Tessera: ShardWriter,
mosaic: MDSWriter, litdata: optimize), uncompressed, 64 MiB shards/chunks; shuffle on, batch 64, default
shuffle settings of each library.

Sections (--only, comma separated; default all):
- local:   local dataset, one shuffled epoch, in the main process and through a DataLoader with 2 workers:
           samples/s. Tessera per-sample and batch_path=True; mosaic with torch's DataLoader; litdata with
           its StreamingDataLoader.
- remote:  SeaweedFS on loopback (tests/s3server.py), cold cache (a fresh, empty cache folder per run; mosaic's
           /dev/shm cleaned), DataLoader with 2 workers: samples/s over the epoch and time to first batch
           (from constructing the dataset, index download included). Tessera also runs the batch path with
           `ranged_reads=False` (its cold start without ranged reads, docs/streaming.md), for comparison.
- resume:  local dataset, time to first batch after load_state_dict at 50% of the epoch vs a fresh start
           (construction + load + first batch), main process and 2 workers; Tessera and mosaic. Median of
           --repeat.
- memory:  peak RSS (VmHWM) and peak private memory (USS) of each DataLoader worker, sampled from /proc
           during the 2-worker runs of local/remote (run here if those sections are off); epoch-plan memory
           for 10M and 1B samples: Tessera's `RunPlan` with synthetic shard sizes (2,000 samples a shard),
           mosaic's partition + py1e shuffle arrays at 10M (1B would need > 8 GB per int64 array). Each plan
           is measured in a fresh child process (tracemalloc peak, RSS growth, time).
- batch:   GB/s of token data from the local dataset: Tessera's batch path (iter_batches in the main
           process; StreamingDataLoader(batch_path=True) with 0 and 2 workers) next to the per-sample paths
           of Tessera and litdata in the main process. Each row is the median (by steady rate) of --repeat
           epochs: at --scale 0.1 an epoch lasts ~0.1 s, so single epochs swing +-20% with the machine's load.
- profile: the per-stage breakdown Tessera prints with TESSERA_STREAM_PROFILE=1 (one line per reader
           process), for the local per-sample and batch runs and a cold remote run.

Consumers are the same for every library: a per-sample loop touches the first and last token of each
sample (so lazily mapped data is really read) or decodes the JPEG with PIL (np.asarray); DataLoaders use
each library's own collate for tokens, and one shared collate that decodes JPEGs with PIL for images
(litdata stores the JPEG bytes, see workloads.py).

    .venv/bin/python benchmarks/stream.py                                  # full size, everything
    .venv/bin/python benchmarks/stream.py --scale 0.1 --only local,batch --workloads tokens
    .venv/bin/python benchmarks/stream.py --work /tmp/stream-data           # keep datasets for reruns

Prints tables, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import workloads as W

BATCH = 64
WORKERS = 2
LIBS = ("tessera", "mosaic", "litdata")


# --- consumers ----------------------------------------------------------------------------------------------
def decode_image(value: Any) -> np.ndarray:
    """Pixels of a stored JPEG: PIL image (MDS readers) or the JPEG bytes (litdata), decoded with PIL."""
    from PIL import Image

    if isinstance(value, (bytes, bytearray, memoryview)):
        value = Image.open(io.BytesIO(value))
    return np.asarray(value)


def image_collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    return {"image": torch.from_numpy(np.stack([decode_image(s["image"]) for s in samples])),
            "label": torch.tensor([int(s["label"]) for s in samples])}


def image_batch_collate(batch: dict[str, Any]) -> dict[str, Any]:
    """Tessera's batch path for images: a list of PIL images and a stacked label array."""
    import torch

    return {"image": torch.from_numpy(np.stack([decode_image(v) for v in batch["image"]])),
            "label": torch.from_numpy(np.asarray(batch["label"], dtype=np.int64))}


def touch_tokens(sample: dict[str, Any]) -> int:
    tokens = sample["tokens"]
    int(tokens[0]) + int(tokens[-1])
    return 1


def touch_image(sample: dict[str, Any]) -> int:
    decode_image(sample["image"])
    return 1


def batch_len(batch: dict[str, Any]) -> int:
    return len(batch["label"] if "label" in batch else batch["tokens"])


# --- datasets ------------------------------------------------------------------------------------------------
def prepare(workload: str, scale: float, work: Path) -> dict[str, Any]:
    """Source data and the three datasets (reused when --work already holds them)."""
    t0 = time.perf_counter()
    root = work / workload
    dirs = {lib: root / lib for lib in LIBS}
    if workload == "tokens":
        n = W.scaled(W.TOKENS_FULL, scale)
        npy = W.make_tokens(work, n)
        source: Any = None
        for lib in LIBS:
            if _complete(dirs[lib], n):
                continue
            W.rm(dirs[lib])
            if lib == "litdata":
                _litdata_child(dirs[lib], workload, npy, n)
            else:
                source = source if source is not None else W.load_tokens(npy)
                (W.tessera_write_tokens if lib == "tessera" else W.mds_write_tokens)(dirs[lib], source, None)
            _mark(dirs[lib], n)
        del source
        raw = n * W.SEQ * 2
    else:
        n = W.scaled(W.IMAGES_FULL, scale)
        files = W.make_images(work, n)
        for lib in LIBS:
            if _complete(dirs[lib], n):
                continue
            W.rm(dirs[lib])
            if lib == "litdata":
                _litdata_child(dirs[lib], workload, work, n)
            else:
                (W.tessera_write_images if lib == "tessera" else W.mds_write_images)(dirs[lib], files, None)
            _mark(dirs[lib], n)
        raw = W.image_bytes(files)
    gc.collect()
    print(f"  prepared {workload}: {n:,} samples, {raw / 1e6:.0f} MB ({time.perf_counter() - t0:.1f}s)",
          file=sys.stderr, flush=True)
    return {"workload": workload, "samples": n, "raw_bytes": raw, "dirs": dirs}


def _complete(path: Path, n: int) -> bool:
    stamp = path.parent / f".{path.name}.complete"
    return (path / "index.json").exists() and stamp.exists() and stamp.read_text() == str(n)


def _mark(path: Path, n: int) -> None:
    (path.parent / f".{path.name}.complete").write_text(str(n))


def _litdata_child(out: Path, workload: str, source: Path, n: int) -> None:
    """litdata.optimize spawns workers that re-import the main module: run it from a light child process."""
    bench = str(Path(__file__).resolve().parent)
    code = ("import workloads as W; from pathlib import Path\n"
            "if __name__ == '__main__':\n"
            f"    out, kind, src, n = Path({str(out)!r}), {workload!r}, Path({str(source)!r}), {n}\n"
            "    if kind == 'tokens':\n"
            "        W.litdata_write(out, W.TokenRow(str(src)), list(range(n)), None, 2)\n"
            "    else:\n"
            "        W.litdata_write(out, W.lit_image, W.make_images(src, n), None, 2)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [bench, os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL, env=env)


class Env:
    """Paths, S3 server and per-run cache folders shared by the sections."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.server: Any = None
        self.remote_ready: set[str] = set()
        self._cache_n = 0

    def cache(self) -> Path:
        self._cache_n += 1
        path = self.work / "caches" / f"c{self._cache_n}"
        W.rm(path)
        return path

    def start_server(self) -> None:
        if self.server is None:
            from tests_shared import tests_module

            start_server = tests_module("s3server").start_server

            self.server = start_server(buckets=("bench",))
            os.environ.update(self.server.env())

    @staticmethod
    def litdata_allow_http() -> None:
        """litdata downloads S3 chunks with obstore, whose client refuses plain-http endpoints unless told
        `allow_http`; litdata does not pass it. Add it to litdata's module-level client options (forked
        DataLoader workers inherit it), so litdata keeps its default (fastest) download path on loopback."""
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True

    def upload(self, data: dict[str, Any]) -> dict[str, str]:
        """Upload the three datasets of a workload (once); their URLs."""
        self.start_server()
        workload = data["workload"]
        urls = {lib: f"s3://bench/{workload}/{lib}" for lib in LIBS}
        if workload not in self.remote_ready:
            client = self.server.boto3_client()
            for lib, root in data["dirs"].items():
                for path in sorted(root.rglob("*")):
                    rel = path.relative_to(root).as_posix()
                    if path.is_file() and not rel.startswith(".tessera"):
                        client.upload_file(str(path), "bench", f"{workload}/{lib}/{rel}")
            self.remote_ready.add(workload)
        os.sync()  # GBs of dirty pages in the server's volume files: do not time their writeback (storage.py)
        return urls

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server.cleanup()
            self.server = None
        W.rm(self.work / "caches")


# --- readers: (dataset factory, loader factory) per library ------------------------------------------------------
def tessera_dataset(src: Path | str, cache: Path | None, **kwargs: Any) -> Any:
    from tessera.stream import StreamingDataset

    if isinstance(src, Path):
        return StreamingDataset(local=str(src), shuffle=True, batch_size=BATCH, **kwargs)
    return StreamingDataset(remote=src, local=str(cache), shuffle=True, batch_size=BATCH, **kwargs)


def mosaic_dataset(src: Path | str, cache: Path | None) -> Any:
    anchors = W.mosaic()
    anchors.clean_stale_shared_memory()
    if isinstance(src, Path):
        return anchors.StreamingDataset(local=str(src), remote=None, shuffle=True, batch_size=BATCH)
    return anchors.StreamingDataset(remote=src, local=str(cache), shuffle=True, batch_size=BATCH)


def s3_options() -> dict[str, str]:
    """litdata's storage_options for the SeaweedFS server named by the environment (Env.start_server)."""
    e = os.environ
    return {"endpoint_url": e["S3_ENDPOINT_URL"], "aws_access_key_id": e["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": e["AWS_SECRET_ACCESS_KEY"], "region_name": e["AWS_REGION"]}


def litdata_dataset(src: Path | str, cache: Path | None, decode_all: bool = False) -> Any:
    import litdata

    options: dict[str, Any] = {"batch_decode": "all"} if decode_all else {}
    if isinstance(src, Path):
        return litdata.StreamingDataset(str(src), shuffle=True, cache_dir=str(cache) if cache else None, **options)
    Env.litdata_allow_http()
    return litdata.StreamingDataset(src, cache_dir=str(cache), shuffle=True, storage_options=s3_options(), **options)


def loader(lib: str, ds: Any, workload: str, workers: int, batch_path: bool = False) -> Any:
    images = workload == "images"
    if lib == "tessera":
        from tessera.stream import StreamingDataLoader

        kwargs: dict[str, Any] = {}
        if images:
            kwargs["collate_fn"] = image_batch_collate if batch_path else image_collate
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, batch_path=batch_path, **kwargs)
    if lib == "mosaic":
        from torch.utils.data import DataLoader

        return DataLoader(ds, batch_size=BATCH, num_workers=workers, **({"collate_fn": image_collate} if images else {}))
    import litdata

    return litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers,
                                       **({"collate_fn": image_collate} if images else {}))


def run(label: str, build: Callable[[], Iterable[Any]], count: Callable[[Any], int], max_samples: int | None,
        memory: bool = False) -> dict[str, Any]:
    """Build (dataset + loader), iterate, time. `first_s` counts from before building; `samples_per_s` from the
    start of iteration to the last item."""
    gc.collect()
    t0 = time.perf_counter()
    source = build()
    t_built = time.perf_counter()
    first, n, n_first, t_first = None, 0, 0, 0.0
    mem = W.WorkerMemory() if memory else None
    if mem:
        mem.__enter__()
    try:
        iterator = iter(source)
        for item in iterator:
            n += count(item)
            if first is None:
                t_first = time.perf_counter()
                first, n_first = t_first - t0, n
            if max_samples and n >= max_samples:
                break
        t_end = time.perf_counter()
        del iterator
    finally:
        if mem:
            mem.__exit__()
    out = {"run": label, "samples": n, "seconds": t_end - t_built, "samples_per_s": n / (t_end - t_built),
           "build_s": t_built - t0, "first_s": first,
           # after the first item: the rate once workers run, without their start-up
           "steady_samples_per_s": (n - n_first) / (t_end - t_first) if n > n_first else None}
    if mem:
        out.update(mem.summary())
    print(f"  {label}: {n:,} samples, {out['samples_per_s']:,.0f}/s, first {first or 0:.3f}s", file=sys.stderr,
          flush=True)
    return out


def per_sample_counter(workload: str) -> Callable[[Any], int]:
    return touch_tokens if workload == "tokens" else touch_image


# --- sections -------------------------------------------------------------------------------------------------------
def local_dataset(lib: str, dirs: dict[str, Path], cache: Path | None) -> Callable[[], Any]:
    """A factory of the library's dataset over its local copy (litdata: with a cache folder)."""
    if lib == "tessera":
        return lambda: tessera_dataset(dirs["tessera"], None)
    if lib == "mosaic":
        return lambda: mosaic_dataset(dirs["mosaic"], None)
    return lambda: litdata_dataset(dirs["litdata"], cache)


def section_local(env: Env, data: dict[str, Any], args: argparse.Namespace, results: dict[str, Any]) -> None:
    wl, dirs, cap = data["workload"], data["dirs"], args.max_samples
    touch = per_sample_counter(wl)
    rows = []
    for lib in args.libs:
        cache = env.cache() if lib == "litdata" else None
        make = local_dataset(lib, dirs, cache)
        rows.append({"lib": lib, "path": "per-sample", "mode": "main",
                     **run(f"{wl} local {lib} main", make, touch, cap)})
        rows.append({"lib": lib, "path": "per-sample", "mode": f"DL w={WORKERS}",
                     **run(f"{wl} local {lib} DL{WORKERS}", lambda lib=lib, make=make: loader(lib, make(), wl, WORKERS),
                           batch_len, cap, memory=True)})
        if lib == "tessera":
            rows.append({"lib": lib, "path": "batch", "mode": "main",
                         **run(f"{wl} local tessera batch main", lambda make=make: _batches_main(make(), wl),
                               batch_len, cap)})
            rows.append({"lib": lib, "path": "batch", "mode": f"DL w={WORKERS}",
                         **run(f"{wl} local tessera batch DL{WORKERS}",
                               lambda make=make: loader("tessera", make(), wl, WORKERS, batch_path=True), batch_len,
                               cap, memory=True)})
        if cache:
            W.rm(cache)
    results.setdefault("local", {})[wl] = rows


def _batches_main(ds: Any, workload: str) -> Iterable[Any]:
    """Tessera's batch path in the main process (images: the same PIL decode the DataLoader collate does)."""
    if workload == "tokens":
        return ds.iter_batches()
    return (image_batch_collate(b) for b in ds.iter_batches())


def section_remote(env: Env, data: dict[str, Any], args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Each run in a fresh child process: a cold process as well as a cold cache, and no library inherits
    another's state across fork (litdata's forked workers hang in obstore once anything in the parent
    process, here Tessera, has started obstore's runtime).

    litdata runs twice: with its defaults, and with batch_decode="all". Its default ("auto": windows of
    256 rows) re-reads the whole downloaded chunk file for every window when the chunk is not memory-mapped,
    which is the case for remote chunks (litdata/streaming/item_loader.py, _fill_decode_window_path);
    "all" decodes each chunk once and is its fastest setting found here."""
    wl = data["workload"]
    urls = env.upload(data)
    rows = []
    runs = [("tessera", "download only"), ("tessera", "per-sample"), ("tessera", "batch"),
            ("tessera", "batch ranged_reads=False"),
            ("mosaic", "per-sample"), ("litdata", "per-sample"), ("litdata", "batch_decode=all")]
    for lib, path in [r for r in runs if r[0] in args.libs]:
        cap = args.max_samples
        if (lib, path) == ("litdata", "per-sample") and args.slow_cap:  # slow on tokens (RESULTS.md): a partial epoch
            cap = min(cap or args.slow_cap, args.slow_cap)
        spec = {"lib": lib, "path": path, "workload": wl, "url": urls[lib], "max_samples": cap}
        try:
            result, _ = child_run(spec, env)
        except RuntimeError as err:
            result = {"error": str(err).strip().splitlines()[-1]}
        rows.append({"lib": lib, "path": path, "mode": f"DL w={WORKERS}", **result})
        W.mosaic().clean_stale_shared_memory()
    results.setdefault("remote", {})[wl] = rows


def child_run(spec: dict[str, Any], env: Env, profile: bool = False, attempts: int = 2) -> tuple[dict[str, Any], str]:
    """Run one remote measurement in a child process with a fresh cache folder; (its result, its stderr).

    A failed run is retried once (mosaic's shared-memory coordination occasionally reads a shard too early on
    this loaded machine: "Relative sample index ... is not present"); the error is kept in the results."""
    child_env = dict(os.environ)
    if profile:
        child_env["TESSERA_STREAM_PROFILE"] = "1"
    error = ""
    for _ in range(attempts):
        cache = env.cache()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child-run", json.dumps({**spec, "cache": str(cache)})]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env)
        W.rm(cache)
        os.sync()  # the next run starts with no writeback of this one's cache files pending
        sys.stderr.write("".join(line + "\n" for line in proc.stderr.splitlines() if line.startswith("  ")))
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith(" ")]
        error = lines[-1] if lines else f"exit code {proc.returncode}"
        print(f"  child run {spec['lib']} {spec['path']} failed: {error}", file=sys.stderr, flush=True)
    raise RuntimeError(f"child run {spec} failed: {error}")


def download_only(url: str, cache: Path) -> Iterable[int]:
    """The floor under a cold epoch: every shard downloaded by the storage layer, 4 at a time as the
    prefetcher does, nothing read. Yields each shard's sample count as it lands (counted like samples)."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from tessera.shards.index import DatasetIndex
    from tessera.storage import download_from, open_store

    store = open_store(url)
    entries = DatasetIndex.from_json(store.get("index.json"), url).shards
    with ThreadPoolExecutor(4) as pool:
        jobs = {pool.submit(download_from, store, e.raw_data.basename, cache / e.raw_data.basename,
                            size=e.raw_data.bytes): e.samples for e in entries}
        for job in as_completed(jobs):
            job.result()
            yield jobs[job]


def child_remote_run(spec: dict[str, Any]) -> dict[str, Any]:
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    lib, wl, url, cache = spec["lib"], spec["workload"], spec["url"], Path(spec["cache"])
    if spec["path"] == "download only":
        return run(f"{wl} remote cold tessera download only", lambda: download_only(url, cache), int, None)
    W.mosaic()
    import litdata  # noqa: F401  (imports outside the timed region, as in the parent)

    ranged = "ranged_reads=False" not in spec["path"]  # Tessera's cold start without ranged reads, to compare
    make = {"tessera": lambda: tessera_dataset(url, cache, ranged_reads=ranged),
            "mosaic": lambda: mosaic_dataset(url, cache),
            "litdata": lambda: litdata_dataset(url, cache, spec["path"] == "batch_decode=all")}[lib]
    batch_path = spec["path"] in ("batch", "batch ranged_reads=False")
    try:
        return run(f"{wl} remote cold {lib} {spec['path']}", lambda: loader(lib, make(), wl, WORKERS, batch_path),
                   batch_len, spec.get("max_samples"), memory=True)
    finally:
        if lib == "mosaic":
            W.mosaic().clean_stale_shared_memory()


def _epoch_len_tessera(path: Path) -> int:
    ds = tessera_dataset(path, None)
    return len(ds._run.epoch(0))


def section_resume(env: Env, data: dict[str, Any], args: argparse.Namespace, results: dict[str, Any]) -> None:
    wl, dirs = data["workload"], data["dirs"]
    rows = []
    # Tessera: the state at 50% (batch-aligned), taken without iterating.
    n = _epoch_len_tessera(dirs["tessera"])
    half = (n // 2) // BATCH * BATCH
    t_state = tessera_dataset(dirs["tessera"], None).state_dict(half)
    m_ds = mosaic_dataset(dirs["mosaic"], None)
    m_state = m_ds.state_dict(half, True)
    del m_ds
    W.mosaic().clean_stale_shared_memory()
    for workers in (0, WORKERS):
        for lib in ("tessera", "mosaic"):
            for resumed in (False, True):
                def build(lib: str = lib, resumed: bool = resumed, workers: int = workers) -> Any:
                    if lib == "tessera":
                        ds = tessera_dataset(dirs["tessera"], None)
                        dl = loader("tessera", ds, wl, workers)
                        if resumed:
                            dl.load_state_dict(t_state)
                        return dl
                    ds = mosaic_dataset(dirs["mosaic"], None)
                    if resumed:
                        ds.load_state_dict(m_state)
                    return loader("mosaic", ds, wl, workers)

                firsts = [run(f"{wl} resume {lib} w={workers} {'resumed' if resumed else 'fresh'}", build, batch_len,
                              1)["first_s"] for _ in range(args.repeat)]
                rows.append({"lib": lib, "workers": workers, "start": "50%" if resumed else "fresh",
                             "first_batch_s": statistics.median(firsts), "runs": firsts})
    W.mosaic().clean_stale_shared_memory()
    results.setdefault("resume", {})[wl] = {"position": half, "epoch": n, "rows": rows}


def section_batch(env: Env, data: dict[str, Any], args: argparse.Namespace, results: dict[str, Any]) -> None:
    if data["workload"] != "tokens":
        return
    dirs, cap = data["dirs"], args.max_samples
    rows = []

    def rerun(label: str, build: Callable[[], Iterable[Any]], count: Callable[[Any], int],
              max_samples: int | None) -> dict[str, Any]:
        runs = [run(label, build, count, max_samples) for _ in range(max(1, args.repeat))]
        runs.sort(key=lambda r: r["steady_samples_per_s"] or 0)
        return {**runs[len(runs) // 2], "steady_runs": [r["steady_samples_per_s"] for r in runs]}

    make = lambda: tessera_dataset(dirs["tessera"], None)  # noqa: E731
    rows.append({**rerun("batch main", lambda: make().iter_batches(), batch_len, cap),
                 "run": "tessera batch path: iter_batches (main process)"})
    for workers in (0, WORKERS):
        rows.append({**rerun(f"batch DL{workers}", lambda w=workers: loader("tessera", make(), "tokens", w, True),
                           batch_len, cap),
                     "run": f"tessera batch path: StreamingDataLoader(batch_path=True), {workers} workers"})
    rows.append({**rerun("per-sample main", make, touch_tokens, cap), "run": "tessera per-sample (main process)"})
    rows.append({**rerun(f"per-sample DL{WORKERS}", lambda: loader("tessera", make(), "tokens", WORKERS), batch_len,
                       cap), "run": f"tessera per-sample path, default collate, {WORKERS} workers"})
    rows.append({**rerun(f"per-sample DL{WORKERS} collate_fn", lambda: _explicit_collate(make()), batch_len, cap),
                 "run": f"tessera per-sample path, explicit collate_fn (data through torch's queues), {WORKERS} "
                        "workers"})
    caches: list[Path] = []  # a fresh litdata cache folder per epoch, as for its single run before

    def litdata_fresh() -> Any:
        caches.append(env.cache())
        return litdata_dataset(dirs["litdata"], caches[-1])

    rows.append({**rerun("litdata main", litdata_fresh, touch_tokens, cap), "run": "litdata per-sample (main process)"})
    for cache in caches:
        W.rm(cache)
    for r in rows:
        r["gb_per_s"] = r["samples_per_s"] * W.SEQ * 2 / 1e9
        r["steady_gb_per_s"] = (r["steady_samples_per_s"] or 0) * W.SEQ * 2 / 1e9
    results["batch"] = rows


def _explicit_collate(ds: Any) -> Any:
    """Tessera's per-sample DataLoader with a user collate_fn: workers then send the collated tensors
    through torch's queues (what any custom collate gets), instead of the (shard, row) handoff."""
    from tessera.stream import StreamingDataLoader
    from tessera.stream.loader import collate_samples

    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=collate_samples)


PROFILE_LINE = re.compile(r"\[tessera\.stream\][^\n]*")


def section_profile(env: Env, data: dict[str, Any], args: argparse.Namespace, results: dict[str, Any],
                    remote: bool) -> None:
    wl, dirs = data["workload"], data["dirs"]
    runs: list[tuple[str, Callable[[], Any]]] = [
        ("local per-sample DL2", lambda: loader("tessera", tessera_dataset(dirs["tessera"], None), wl, WORKERS)),
        ("local batch DL2", lambda: loader("tessera", tessera_dataset(dirs["tessera"], None), wl, WORKERS, True)),
        ("local per-sample main", lambda: tessera_dataset(dirs["tessera"], None)),
    ]
    out = []
    os.environ["TESSERA_STREAM_PROFILE"] = "1"
    try:
        for name, build in runs:
            count = batch_len if "DL2" in name else per_sample_counter(wl)
            with W.captured_stderr() as text:
                stats = run(f"{wl} profile {name}", build, count, args.max_samples)
            lines = PROFILE_LINE.findall(text[0]) if text else []
            out.append({"run": name, "samples_per_s": stats["samples_per_s"], "lines": lines})
    finally:
        os.environ.pop("TESSERA_STREAM_PROFILE", None)
    if remote:
        urls = env.upload(data)
        for path in ("per-sample", "batch"):
            stats, text = child_run({"lib": "tessera", "path": path, "workload": wl, "url": urls["tessera"],
                                     "max_samples": args.max_samples}, env, profile=True)
            out.append({"run": f"remote cold {path} DL2", "samples_per_s": stats["samples_per_s"],
                        "lines": PROFILE_LINE.findall(text)})
    results.setdefault("profile", {})[wl] = out


def section_memory_workers(env: Env, data: dict[str, Any], args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Worker memory for the local 2-worker runs when the local section did not run."""
    if data["workload"] in results.get("local", {}):
        return
    wl, dirs = data["workload"], data["dirs"]
    rows = []
    for lib in args.libs:
        cache = env.cache() if lib == "litdata" else None
        make = local_dataset(lib, dirs, cache)
        rows.append({"lib": lib, "path": "per-sample", "mode": f"DL w={WORKERS}",
                     **run(f"{wl} memory {lib} DL{WORKERS}", lambda lib=lib, make=make: loader(lib, make(), wl, WORKERS),
                           batch_len, args.max_samples, memory=True)})
        if cache:
            W.rm(cache)
    results.setdefault("memory_runs", {})[wl] = rows


# --- epoch-plan memory, each in a fresh child process -------------------------------------------------------------
def child_plan(kind: str, samples: int, per_shard: int) -> dict[str, Any]:
    sizes = np.full(samples // per_shard, per_shard, dtype=np.int64)
    if kind == "tessera":
        from tessera.stream.batching.epoch_plan import PlanConfig, RunPlan
        from tessera.stream.batching.mixing import StreamShards
        from tessera.stream.batching.random_batches import BatchSchedule
    else:
        W.mosaic()
        from streaming.base.partition import get_partitions
        from streaming.base.shuffle import get_shuffle
    gc.collect()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if kind == "tessera":
        run_plan = RunPlan([StreamShards(sizes)], PlanConfig(seed=9176, num_lanes=64, shuffle=True))
        epoch = run_plan.epoch(0)
        first = BatchSchedule(epoch, BATCH * 8).global_batch(0)  # a global batch of 8 ranks x 64
        t_first = time.perf_counter() - t0
        mid = BatchSchedule(epoch, BATCH * 8, start=len(epoch) // 2 // (BATCH * 8) * (BATCH * 8)).global_batch(0)
        extra = {"plan_nbytes_mb": epoch.nbytes / 1e6, "first_batch_s": t_first, "resume_batch_ok": mid.size > 0,
                 "first_ids": first[:3].tolist()}
    else:
        # What mosaic's generate_work_random_batching does for one node, one rank, 2 workers, batch 64.
        big = get_partitions("orig", samples, 64, 1, 1, WORKERS, BATCH, 0)
        shuffle = get_shuffle("py1e", sizes, 64, 9176, 0, 1 << 18)
        work = np.where(big != -1, shuffle[big], -1)
        extra = {"partition_mb": big.nbytes / 1e6, "shuffle_mb": shuffle.nbytes / 1e6, "work_mb": work.nbytes / 1e6}
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"kind": kind, "samples": samples, "shards": int(sizes.size), "seconds": seconds,
            "tracemalloc_peak_mb": peak / 1e6, "rss_growth_mb": (rss1 - rss0) / 1e6, **extra}


def section_plan_memory(args: argparse.Namespace, results: dict[str, Any]) -> None:
    rows = []
    jobs = [("tessera", 10_000_000), ("tessera", 1_000_000_000), ("mosaic", 10_000_000)]
    for kind, samples in jobs:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child-plan", kind, str(samples), "2000"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            rows.append({"kind": kind, "samples": samples, "error": proc.stderr.strip().splitlines()[-1:]})
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"  plan {kind} {samples:,}: {rows[-1]['seconds']:.2f}s, peak {rows[-1]['tracemalloc_peak_mb']:.0f} MB",
              file=sys.stderr, flush=True)
    rows.append({"kind": "mosaic", "samples": 1_000_000_000, "skipped": "not run: its partition, shuffle and work "
                 "arrays are int64 per sample (>= 8 GB each, > 24 GB together) on this 23 GB machine"})
    results["plan_memory"] = rows


# --- report ------------------------------------------------------------------------------------------------------------
def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    for wl, rows in results.get("local", {}).items():
        lit = {r["mode"]: r["samples_per_s"] for r in rows if r["lib"] == "litdata"}
        W.print_table(f"Local, one shuffled epoch, batch {BATCH} ({wl})",
                      ["library", "path", "mode", "samples", "samples/s", "x litdata", "first (s)"],
                      [[r["lib"], r["path"], r["mode"], r["samples"], r["samples_per_s"],
                        f"x{r['samples_per_s'] / lit[r['mode']]:.2f}" if r["mode"] in lit else None, r["first_s"]]
                       for r in rows])
    for wl, rows in results.get("remote", {}).items():
        lit = max((r["samples_per_s"] for r in rows if r["lib"] == "litdata" and "samples_per_s" in r), default=None)
        local = {(r["lib"], r["path"]): r["samples_per_s"] for r in results.get("local", {}).get(wl, [])
                 if r["mode"] == f"DL w={WORKERS}"}
        W.print_table(f"Remote (SeaweedFS loopback), cold cache, DataLoader {WORKERS} workers ({wl}); x litdata: "
                      "against litdata's faster run",
                      ["library", "path", "samples", "samples/s", "x litdata", "vs warm local", "first batch (s)",
                       "error"],
                      [[r["lib"], r["path"], r.get("samples"), r.get("samples_per_s"),
                        f"x{r['samples_per_s'] / lit:.2f}" if lit and "samples_per_s" in r else None,
                        f"{r['samples_per_s'] / local[(r['lib'], r['path'])]:.0%}"
                        if (r["lib"], r["path"]) in local and "samples_per_s" in r else None,
                        r.get("first_s"), r.get("error")] for r in rows])
    for wl, res in results.get("resume", {}).items():
        rows = res["rows"]
        fresh = {(r["lib"], r["workers"]): r["first_batch_s"] for r in rows if r["start"] == "fresh"}
        mosaic = {r["workers"]: r["first_batch_s"] for r in rows if r["lib"] == "mosaic" and r["start"] == "50%"}
        W.print_table(f"Resume at 50% ({res['position']:,} of {res['epoch']:,}): time to first batch, median of "
                      f"{args.repeat} ({wl})",
                      ["library", "workers", "start", "first batch (s)", "vs fresh", "vs mosaic resumed"],
                      [[r["lib"], r["workers"], r["start"], r["first_batch_s"],
                        f"x{r['first_batch_s'] / fresh[(r['lib'], r['workers'])]:.2f}",
                        f"x{r['first_batch_s'] / mosaic[r['workers']]:.2f}" if r["start"] == "50%" else None]
                       for r in rows])
    mem_rows = []
    for section in ("local", "remote", "memory_runs"):
        for wl, rows in results.get(section, {}).items():
            mem_rows += [[wl, section, r["lib"], r["path"], r.get("workers_seen"), r.get("peak_rss_mb"),
                          r.get("peak_anon_mb"), r.get("peak_uss_mb"), r.get("tree_anon_mb"), r.get("tree_file_mb"),
                          r.get("tree_shmem_mb")] for r in rows if "peak_rss_mb" in r]
    if mem_rows:
        W.print_table(f"Peak memory per DataLoader worker, max over the {WORKERS} workers (RSS = VmHWM: includes "
                      "pages shared with the parent and mapped shard files; anon = RssAnon: heap and buffers; "
                      "USS = private, includes mapped file pages only this worker touched); then the whole process "
                      "tree's peak of anonymous, file-backed (mapped shards, page cache of read files) and "
                      "shared-memory (/dev/shm, shared slots) resident pages, summed over its processes",
                      ["workload", "run", "library", "path", "workers", "peak RSS MB", "peak anon MB",
                       "peak USS MB", "tree anon MB", "tree file MB", "tree shmem MB"], mem_rows)
    if "plan_memory" in results:
        W.print_table("Epoch-plan memory (fresh process; 64 lanes, 2,000 samples a shard)",
                      ["planner", "samples", "shards", "seconds", "tracemalloc peak MB", "RSS growth MB",
                       "plan arrays MB", "note"],
                      [[r["kind"], r["samples"], r.get("shards"), r.get("seconds"), r.get("tracemalloc_peak_mb"),
                        r.get("rss_growth_mb"), r.get("plan_nbytes_mb", (r.get("partition_mb") or 0)
                                                      + (r.get("shuffle_mb") or 0) or None),
                        r.get("skipped") or r.get("error")] for r in results["plan_memory"]])
    if "batch" in results:
        W.print_table("Token data from the local dataset (GB/s = samples/s x 4096 bytes; steady: after the first "
                      "batch, i.e. without worker start-up)",
                      ["run", "samples", "samples/s", "GB/s", "steady GB/s", "first (s)"],
                      [[r["run"], r["samples"], r["samples_per_s"], r["gb_per_s"], r["steady_gb_per_s"],
                        r["first_s"]] for r in results["batch"]])
    for wl, runs in results.get("profile", {}).items():
        print(f"\n## Per-stage breakdown, TESSERA_STREAM_PROFILE=1 ({wl})")
        for r in runs:
            print(f"{r['run']} ({r['samples_per_s']:,.0f} samples/s):")
            for line in r["lines"] or ["(no profile line captured)"]:
                print(f"    {line}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full workloads (1 GB tokens, 50k images)")
    ap.add_argument("--only", default="local,remote,resume,memory,batch,profile")
    ap.add_argument("--workloads", default="tokens,images")
    ap.add_argument("--repeat", type=int, default=3, help="runs per resume measurement (median)")
    ap.add_argument("--libs", default=",".join(LIBS), help="libraries to run in local, remote and memory")
    ap.add_argument("--max-samples", type=int, default=None, help="stop each epoch after this many samples")
    ap.add_argument("--slow-cap", type=int, default=20_000,
                    help="samples read by litdata's default remote run, which is pathologically slow (0: all)")
    ap.add_argument("--work", default=None, help="data folder (kept and reused); default: temp, removed")
    ap.add_argument("--child-plan", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--child-run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_run:
        print(json.dumps(child_remote_run(json.loads(args.child_run))))
        return
    if args.child_plan:
        kind, samples, per_shard = args.child_plan
        print(json.dumps(child_plan(kind, int(samples), int(per_shard))))
        return
    args.libs = args.libs.split(",")
    sections = set(args.only.split(","))
    unknown = sections - {"local", "remote", "resume", "memory", "batch", "profile"}
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tessera-bench-stream-"))
    work.mkdir(parents=True, exist_ok=True)
    env = Env(work)
    results: dict[str, Any] = {}
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    W.mosaic()  # import streaming (and torch) before any timing
    import litdata  # noqa: F401
    try:
        for wl in args.workloads.split(","):
            data = prepare(wl, args.scale, work)
            if "local" in sections:
                section_local(env, data, args, results)
            if "remote" in sections:
                section_remote(env, data, args, results)
            if "resume" in sections:
                section_resume(env, data, args, results)
            if "memory" in sections:
                section_memory_workers(env, data, args, results)
            if "batch" in sections:
                section_batch(env, data, args, results)
            if "profile" in sections:
                section_profile(env, data, args, results, remote="remote" in sections)
        if "memory" in sections:
            section_plan_memory(args, results)
    finally:
        env.close()
        W.mosaic().clean_stale_shared_memory()
        if not args.work:
            W.rm(work)
    report(results, args)
    W.dump_json({"benchmark": "stream", "scale": args.scale, "batch_size": BATCH, "workers": WORKERS,
                 "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "results": results})


if __name__ == "__main__":
    main()
