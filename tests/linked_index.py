"""A dataset of many shards without the disk: a few real shard files, every shard a hard link to one.

Shard i is a hard link to real file i % R, whose row k holds `tokens = [i % R, k, 7, ...]` (uint16), so
the content of any global sample tells which real file and row it came from: `expected_row`. Used by
tests/stream/test_packed_index.py (small) and benchmarks/index_scale.py (50k-500k shards). ext4 allows
65,000 links per file, so R grows with the shard count.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from tessera.shards import ShardWriter

COLUMNS = {"tokens": "ndarray:uint16:16"}
LINKS_PER_FILE = 60_000


def expected_row(shard: int, row: int, real: int) -> np.ndarray:
    """The tokens of row `row` of shard `shard` in a dataset of `real` real files."""
    out = np.full(16, 7, np.uint16)
    out[0], out[1] = shard % real, row
    return out


def real_files(shards: int) -> int:
    return max(4, math.ceil(shards / LINKS_PER_FILE))


def write_linked(root: Path, shards: int, samples: int = 1024) -> int:
    """Write the dataset into `root` (index.json and `shards` links); the number of real files."""
    real = real_files(shards)
    source = root / ".real"
    entries = []
    for r in range(real):
        with ShardWriter(source / str(r), COLUMNS, size_limit=1 << 30, hashes=["xxh64"]) as writer:
            for k in range(samples):
                writer.write({"tokens": expected_row(r, k, real)})
        entry = json.loads((source / str(r) / "index.json").read_text())["shards"][0]
        entries.append(json.dumps(entry, sort_keys=True).replace("shard.00000.mds", "{name}"))
    parts = []
    for i in range(shards):
        name = f"shard.{i:06}.mds"
        os.link(source / str(i % real) / "shard.00000.mds", root / name)
        parts.append(entries[i % real].replace("{name}", name))
    (root / "index.json").write_text('{"shards": [' + ", ".join(parts) + '], "version": 2}')
    return real
