"""Sample builders shared by the shard tests (a unique module name: tests/stream has its own helpers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

MIXED_COLUMNS = {"id": "int", "text": "str", "tokens": "ndarray:uint16:4", "score": "float32", "blob": "bytes"}


def mixed_sample(i: int) -> dict:
    """A sample with fixed and variable columns, different for every i."""
    return {"id": i, "text": "x" * (i % 7), "tokens": np.arange(4, dtype=np.uint16) + i,
            "score": np.float32(i) / 4, "blob": bytes([i % 256]) * (i % 5)}


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def without_provenance(files: dict[str, bytes]) -> dict[str, bytes]:
    """A dataset's files ({name: bytes}) with index.json as a writer given no `sources` writes it: without
    `convert`'s record of input rows (provenance.py), so a conversion compares byte for byte with samples
    written one `ShardWriter.write` at a time."""
    index = json.loads(files["index.json"])
    index.pop("tessera_provenance")
    return {**files, "index.json": json.dumps(index, sort_keys=True).encode("utf-8")}
