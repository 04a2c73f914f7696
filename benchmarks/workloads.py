"""Shared pieces of the shard and stream benchmarks: workloads, writers for each library, measuring helpers.

Workloads (the same bytes for every library):
- tokens: `tokens` = 2048 random uint16 token ids < 50,257 (4096 bytes a sample); 244,140 samples ~ 1 GB at --scale 1.
  Generated once into `tokens.npy`; writers read rows from it (in RAM, or memory-mapped in litdata's
  spawned workers).
- images: 50,000 32x32 RGB JPEGs (smooth random pictures, PIL quality 90, ~1 KB each) + an int label
  (10 classes), generated once with PIL into an image folder `images/class_NN/NNNNNNN.jpg`. The sample
  order is the folder's (class, then file name): the order `tessera data convert` reads an image folder in.

Anchors: mosaicml-streaming 0.13 (imported through tests/anchors.py, which registers the torchvision
stand-in first) and litdata 0.2.76 (version check off).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")



def mosaic():
    """tests/anchors.py (torchvision stand-in, then `import streaming`), imported on first use so that
    processes that only write with Tessera or litdata do not pay for it."""
    from tests_shared import tests_module

    return tests_module("anchors")

TOKENS_FULL = 244_140  # x 4096 bytes = 1.0 GB
IMAGES_FULL = 50_000
SEQ = 2048
VOCAB = 50_257  # GPT-2's vocabulary: random ids below it, so zstd finds ~1.6% to save, as on real tokens
TOKEN_COLUMNS = {"tokens": f"ndarray:uint16:{SEQ}"}
IMAGE_COLUMNS = {"image": "jpeg", "label": "int"}
NUM_CLASSES = 10
SIZE_LIMIT = 1 << 26  # 64 MiB shards/chunks for every library (MDSWriter's default)


# --- workloads ----------------------------------------------------------------------------------------
def scaled(full: int, scale: float, minimum: int = 256) -> int:
    return max(minimum, int(round(full * scale)))


def make_tokens(work: Path, n: int, seed: int = 0) -> Path:
    """`tokens.npy` of shape (n, 2048) uint16, reused when it already has that shape."""
    path = work / "tokens.npy"
    stamp = work / "tokens.npy.complete"
    if path.exists() and stamp.exists() and stamp.read_text() == f"{n}:{seed}:{VOCAB}":
        return path
    work.mkdir(parents=True, exist_ok=True)
    tmp = work / "tokens.tmp.npy"
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint16, shape=(n, SEQ))
    rng = np.random.default_rng(seed)
    for lo in range(0, n, 16384):
        hi = min(n, lo + 16384)
        out[lo:hi] = rng.integers(0, VOCAB, (hi - lo, SEQ), dtype=np.uint16)
    out.flush()
    del out
    os.replace(tmp, path)
    stamp.write_text(f"{n}:{seed}:{VOCAB}")
    return path


def load_tokens(path: Path) -> np.ndarray:
    """The whole token array in RAM (in-process writers take rows from it)."""
    return np.load(path)


def _jpeg(rng: np.random.Generator) -> bytes:
    from PIL import Image

    small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((32, 32), Image.BILINEAR)
    noisy = np.clip(np.asarray(image, dtype=np.int16) + rng.integers(-8, 9, (32, 32, 3)), 0, 255)
    out = io.BytesIO()
    Image.fromarray(noisy.astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def make_images(work: Path, n: int, seed: int = 0) -> list[tuple[str, int]]:
    """An image folder of n JPEGs in NUM_CLASSES class sub-folders; returns [(path, label)] in folder order."""
    root = work / "images"
    stamp = root / ".complete"
    if not (stamp.exists() and stamp.read_text() == str(n)):
        shutil.rmtree(root, ignore_errors=True)
        rng = np.random.default_rng(seed)
        for c in range(NUM_CLASSES):
            (root / f"class_{c:02d}").mkdir(parents=True)
        for i in range(n):
            (root / f"class_{i % NUM_CLASSES:02d}" / f"{i:07d}.jpg").write_bytes(_jpeg(rng))
        stamp.write_text(str(n))
    files = []
    for c in range(NUM_CLASSES):
        folder = root / f"class_{c:02d}"
        files += [(str(folder / name), c) for name in sorted(os.listdir(folder))]
    return files


def image_bytes(files: list[tuple[str, int]]) -> int:
    return sum(os.path.getsize(f) for f, _ in files)


# --- writers: one function per library, same samples -------------------------------------------------------
def tessera_write_tokens(out: Path, tokens: np.ndarray, compression: str | None) -> None:
    from tessera.shards import ShardWriter

    with ShardWriter(out, TOKEN_COLUMNS, compression=compression, size_limit=SIZE_LIMIT) as writer:
        for row in tokens:
            writer.write({"tokens": row})


def mds_write_tokens(out: Path, tokens: np.ndarray, compression: str | None) -> None:
    with mosaic().MDSWriter(out=str(out), columns=TOKEN_COLUMNS, compression=compression,
                           size_limit=SIZE_LIMIT) as writer:
        for row in tokens:
            writer.write({"tokens": row})


def tessera_write_images(out: Path, files: list[tuple[str, int]], compression: str | None) -> None:
    """Tessera takes the JPEG file's bytes as they are (no decode, no re-encode)."""
    from tessera.shards import ShardWriter

    with ShardWriter(out, IMAGE_COLUMNS, compression=compression, size_limit=SIZE_LIMIT) as writer:
        for path, label in files:
            with open(path, "rb") as f:
                writer.write({"image": f.read(), "label": label})


def mds_write_images(out: Path, files: list[tuple[str, int]], compression: str | None) -> None:
    """MosaicML's idiom: a PIL JpegImageFile opened from the file; its `jpeg` encoder copies the file's bytes."""
    from PIL import Image

    with mosaic().MDSWriter(out=str(out), columns=IMAGE_COLUMNS, compression=compression,
                           size_limit=SIZE_LIMIT) as writer:
        for path, label in files:
            with Image.open(path) as image:
                writer.write({"image": image, "label": label})


class TokenRow:
    """litdata `fn`: the i-th token row, from a memory-mapped .npy (cheap to pickle into spawned workers)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._arr: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_arr": None}

    def __call__(self, i: int) -> dict[str, Any]:
        if self._arr is None:
            self._arr = np.load(self.path, mmap_mode="r")
        return {"tokens": np.array(self._arr[i])}


def lit_image(item: tuple[str, int]) -> dict[str, Any]:
    """litdata `fn` for images: the JPEG file's bytes (litdata's jpeg serializer decodes through
    torchvision.io, which cannot load beside this torch; bytes are stored as they are and decoded with
    PIL by the consumer, the same decoder the MDS readers use)."""
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def litdata_write(out: Path, fn: Callable[[Any], Any], inputs: list[Any], compression: str | None,
                  workers: int) -> None:
    import litdata

    litdata.optimize(fn=fn, inputs=inputs, output_dir=str(out), chunk_bytes=SIZE_LIMIT, num_workers=workers,
                     compression=compression, compression_level="chunk" if compression else None, verbose=False,
                     reorder_files=False, keep_data_ordered=True)


def write_parquet_tokens(tokens_path: Path, out: Path, rows_per_group: int = 4096) -> Path:
    """The tokens as a Parquet file with one binary column (4096 bytes a row): `convert`'s input.

    `ShardWriter` stores a `bytes` value of an `ndarray:uint16:2048` column as it is, so this is the same
    data without a per-row array conversion."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arr = np.load(tokens_path, mmap_mode="r")
    if out.exists():
        meta = pq.ParquetFile(out).metadata
        if meta.num_rows == arr.shape[0]:
            return out
    tmp = out.with_suffix(".tmp")
    schema = pa.schema([("tokens", pa.binary())])
    with pq.ParquetWriter(tmp, schema, compression="none") as writer:
        for lo in range(0, arr.shape[0], rows_per_group):
            block = np.ascontiguousarray(arr[lo:lo + rows_per_group])
            values = pa.py_buffer(block.tobytes())
            offsets = pa.py_buffer((np.arange(block.shape[0] + 1, dtype=np.int32) * block.shape[1] * 2).tobytes())
            column = pa.Array.from_buffers(pa.binary(), block.shape[0], [None, offsets, values])
            writer.write_table(pa.table({"tokens": column}, schema=schema), row_group_size=rows_per_group)
    os.replace(tmp, out)
    return out


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# --- measuring ------------------------------------------------------------------------------------------------
def median_time(fn: Callable[[], Any], repeats: int, before: Callable[[], Any] | None = None) -> float:
    runs = []
    for _ in range(repeats):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(value.split()[0]) * 1024
        with open(f"/proc/{pid}/smaps_rollup") as f:
            uss = 0
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    uss += int(line.split()[1]) * 1024
            out["USS"] = uss
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def child_pids(exclude: Iterable[int] = ()) -> list[int]:
    """DataLoader workers of this process: its Python descendants that have no Python children of their own,
    minus resource trackers, forkserver processes (the workers are their children) and `exclude`."""
    me, skip = os.getpid(), set(exclude)
    parent: dict[int, int] = {}
    python: set[int] = set()
    forkservers: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            parent[pid] = int(stat[stat.rindex(")") + 2:].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if b"python" in cmd and b"resource_tracker" not in cmd:
            python.add(pid)
            if b"forkserver" in cmd:
                forkservers.add(pid)
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], list(children.get(me, []))
    while stack:
        pid = stack.pop()
        kids = [k for k in children.get(pid, []) if k in python]
        stack.extend(kids)
        server = pid in forkservers and parent.get(pid) not in forkservers  # workers fork from the server
        if pid in python and not kids and not server and pid not in skip:
            found.append(pid)
    return found


def tree_pids() -> list[int]:
    """This process and all its descendants (DataLoader workers, forkservers, helpers)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                parent[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [os.getpid()]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


class PeriodicSampler:
    """Calls `sample()` every `interval` seconds on a background thread while used as a context manager."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class WorkerMemory(PeriodicSampler):
    """Samples peak RSS (VmHWM) and peak private memory (USS) of this process's Python children, and the
    peak over time of the whole process tree's anonymous, file-backed and shared-memory resident pages
    (each summed over the tree at one instant: what the tree holds at once)."""

    def __init__(self, exclude: Iterable[int] = (), interval: float = 0.1) -> None:
        super().__init__(interval)
        self.exclude = set(exclude)
        self.peaks: dict[int, dict[str, int]] = {}
        self.tree: dict[str, int] = {}  # peak over samples of the tree's sums: RssAnon, RssFile, RssShmem

    def sample(self) -> None:
        for pid in child_pids(self.exclude):
            now = _proc_status(pid)
            if not now:
                continue
            peak = self.peaks.setdefault(pid, {})
            for key, value in now.items():
                peak[key] = max(peak.get(key, 0), value)
        sums: dict[str, int] = {}
        for pid in tree_pids():
            for key, value in _proc_status(pid).items():
                if key in ("RssAnon", "RssFile", "RssShmem"):
                    sums[key] = sums.get(key, 0) + value
        for key, value in sums.items():
            self.tree[key] = max(self.tree.get(key, 0), value)

    def summary(self) -> dict[str, float]:
        """Max over workers of peak RSS (VmHWM: includes pages shared with the parent and mapped shard files),
        of peak anonymous memory (RssAnon: heap, buffers) and of peak private memory (USS: includes mapped
        file pages only this worker touched), in MB."""
        tree = {"tree_anon_mb": self.tree.get("RssAnon", 0) / 1e6, "tree_file_mb": self.tree.get("RssFile", 0) / 1e6,
                "tree_shmem_mb": self.tree.get("RssShmem", 0) / 1e6}
        if not self.peaks:
            return {"workers_seen": 0, "peak_rss_mb": 0.0, "peak_anon_mb": 0.0, "peak_uss_mb": 0.0, **tree}
        peaks = self.peaks.values()
        return {**tree, "workers_seen": len(self.peaks), "peak_rss_mb": max(p.get("VmHWM", 0) for p in peaks) / 1e6,
                "peak_anon_mb": max(p.get("RssAnon", 0) for p in peaks) / 1e6,
                "peak_uss_mb": max(p.get("USS", 0) for p in peaks) / 1e6}


@contextmanager
def captured_stderr():
    """Redirect file descriptor 2 (this process and any child it forks) into a buffer; yields a list that
    receives the captured text on exit."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    out: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace"))


def rm(path: Path | str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n## {title}")
    line = " | ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True))
    print(line)
    print("-" * len(line))
    for row in cells[1:]:
        print(" | ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(row, widths, strict=True)))
    sys.stdout.flush()


def _numeric(text: str) -> bool:
    return bool(re.fullmatch(r"[-+x~]?[\d.,]+[a-zA-Z%x/]*", text))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def dump_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def bench_args(ap: Any, child: Callable[[dict[str, Any]], dict[str, Any]], prefix: str) -> tuple[Any, Path] | None:
    """The common tail of a side-by-side benchmark's command line: `--work` (a kept data folder, else a temp
    one) and the hidden `--child SPEC` (one measurement in a fresh process: runs `child`, prints its JSON
    and returns None). Returns (args, work folder) for the parent."""
    ap.add_argument("--work", default=None, help="data folder (kept and reused); default: temp, removed")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return None
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    return args, work

