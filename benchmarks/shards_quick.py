"""Quick side-by-side of tessera.shards and mosaicml-streaming on this machine (seconds, not minutes).

- write: `tokens` as ndarray:uint16:2048 samples, ShardWriter vs streaming.MDSWriter, one process,
  uncompressed and zstd; best of --repeat runs each, alternating, to damp noise from a shared machine.
- random access: 100k random ds[i] on the written local dataset, MDSDataset vs StreamingDataset.

    .venv/bin/python benchmarks/shards_quick.py [--samples 30000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from tests_shared import tests_module

from tessera.shards import MDSDataset, ShardWriter

anchors = tests_module("anchors")  # torchvision stand-in, then `import streaming`

COLUMNS = {"tokens": "ndarray:uint16:2048"}


def write_mds(out: Path, rows: list, compression: str | None) -> None:
    with anchors.MDSWriter(out=str(out), columns=COLUMNS, compression=compression) as writer:
        for row in rows:
            writer.write(row)


def write_tessera(out: Path, rows: list, compression: str | None) -> None:
    with ShardWriter(out, COLUMNS, compression=compression) as writer:
        for row in rows:
            writer.write(row)


def best_time(fn, out: Path, rows: list, compression: str | None, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        fn(out, rows, compression)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=30000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--reads", type=int, default=100_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50_000, (args.samples, 2048), dtype=np.uint16)
    rows = [{"tokens": row} for row in tokens]
    megabytes = tokens.nbytes / 1e6
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    try:
        for compression in (None, "zstd"):
            theirs = best_time(write_mds, work / "mds", rows, compression, args.repeat)
            ours = best_time(write_tessera, work / "tessera", rows, compression, args.repeat)
            print(f"write {compression or 'none':5s} MDSWriter {megabytes / theirs:6.0f} MB/s   "
                  f"ShardWriter {megabytes / ours:6.0f} MB/s   x{theirs / ours:.2f}")
        indices = rng.integers(0, args.samples, args.reads).tolist()
        ds = MDSDataset(work / "tessera")
        ds[0]
        start = time.perf_counter()
        for i in indices:
            ds[i]
        ours = time.perf_counter() - start
        anchors.clean_stale_shared_memory()
        theirs_ds = anchors.StreamingDataset(local=str(work / "mds"), remote=None, shuffle=False, batch_size=1)
        theirs_ds[0]
        subset = indices[: max(1, args.reads // 5)]  # theirs is slow: time a fifth and scale
        start = time.perf_counter()
        for i in subset:
            theirs_ds[i]
        theirs = (time.perf_counter() - start) * len(indices) / len(subset)
        print(f"random ds[i] x{args.reads}: StreamingDataset {theirs:.2f}s   MDSDataset {ours:.2f}s   "
              f"x{theirs / ours:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
