"""The dataset tools at the scale of half a million shards (issue 24, section 5), checked small:

- `tessera data verify` checks shards in worker processes and still names the one damaged shard, with the
  same problems as the one-process check; without a terminal it prints plain progress lines;
- `--index-only` checks index.json alone (its packed form: packed_index.py), and `inspect` sums it;
- `merge_index` fetches part indexes in parallel (several GETs in flight at once), and the merged bytes
  equal the one-at-a-time merge's, here over 200 part indexes in a SeaweedFS bucket.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.progress import plain_line
from tessera.shards import ShardWriter
from tessera.shards.merge import merge_parts
from tessera.shards.verify import verify_dataset
from tessera.storage import open_store
from tessera.storage.local import LocalStore

runner = CliRunner()
SHARDS = 60


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A dataset of SHARDS shards (two samples each) whose shard 37 has one byte flipped."""
    root = tmp_path_factory.mktemp("verify") / "ds"
    with ShardWriter(root, {"n": "int", "s": "str"}, hashes=["xxh64"], size_limit=270) as writer:
        for i in range(2 * SHARDS):
            writer.write({"n": i, "s": "x" * 20})
    shards = json.loads((root / "index.json").read_text())["shards"]
    assert len(shards) == SHARDS
    path = root / shards[37]["raw_data"]["basename"]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x20
    path.write_bytes(bytes(data))
    return root, 37


def test_parallel_verify_names_the_damaged_shard_with_plain_progress(damaged: tuple[Path, int]) -> None:
    root, bad = damaged
    res = runner.invoke(app, ["data", "verify", str(root), "--workers", "2", "--progress-every", "0"])
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    problems = [line for line in lines if line.startswith("problem:")]
    assert len(problems) == 1 and f"shard.{bad:05d}.mds (shard {bad}): xxh64 is " in problems[0], problems
    # 60 shards in chunks of 2 (60 / (2 workers x 16)), reported in order, without a terminal: one plain
    # line per chunk at --progress-every 0
    progress = [re.fullmatch(r"verifying shards: (\d+)/60 \((\d+\.\d)%\), [\d,]+/s, (\S+) left", line)
                for line in lines if line.startswith("verifying")]
    assert all(progress) and [int(m.group(1)) for m in progress] == list(range(2, 61, 2))  # type: ignore[union-attr]
    assert progress[-1].group(2) == "100.0" and progress[-1].group(3) == "0s"  # type: ignore[union-attr]
    assert lines[-1] == f"1 problem(s) in {root}"
    serial = verify_dataset(root, workers=1)
    assert verify_dataset(root, workers=2).problems == serial.problems and len(serial.problems) == 1
    quiet = runner.invoke(app, ["data", "verify", str(root)])  # a run shorter than 5 s: no progress line
    assert quiet.exit_code == 1 and "verifying" not in quiet.output


def test_index_only_and_inspect_read_the_packed_index(damaged: tuple[Path, int], tmp_path: Path) -> None:
    root, _ = damaged
    res = runner.invoke(app, ["data", "verify", str(root), "--index-only"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"ok: index.json of {SHARDS} shards, {2 * SHARDS} samples in {root}"
    index = json.loads((root / "index.json").read_text())
    res = runner.invoke(app, ["data", "inspect", str(root), "--json"])
    raw = sum(entry["raw_data"]["bytes"] for entry in index["shards"])
    assert json.loads(res.stdout) == {
        "url": str(root), "samples": 2 * SHARDS, "shards": SHARDS, "columns": {"n": "int", "s": "str"},
        "formats": {"mds": SHARDS}, "compression": ["none"], "hashes": ["xxh64"], "raw_bytes": raw,
        "stored_bytes": raw, "compression_ratio": 1.0, "extensions": []}
    index["shards"].append(dict(index["shards"][3]))
    (tmp_path / "index.json").write_text(json.dumps(index))
    res = runner.invoke(app, ["data", "verify", str(tmp_path), "--index-only"])
    assert res.exit_code == 1
    assert res.output.strip() == (f"error: {tmp_path / 'index.json'} (shard {SHARDS}): 'shard.00003.mds' is listed "
                                  "again (first by shard 3): its samples would be read twice; remove the "
                                  "duplicate entry")


def test_plain_progress_line() -> None:
    assert plain_line("verifying shards", 12_288, 488_894, 3.0) == \
        "verifying shards: 12,288/488,894 (2.5%), 4,096/s, 1m56s left"


ENTRY = {"basename": "a", "bytes": 100, "hashes": {}}


def _entry(name: str, samples: int) -> dict:
    return {"column_encodings": ["int"], "column_names": ["n"], "column_sizes": [8], "compression": None,
            "format": "mds", "hashes": [], "raw_data": {**ENTRY, "basename": name}, "samples": samples,
            "size_limit": None, "version": 2, "zip_data": None}


# --- merge_index ---------------------------------------------------------------------------------------------
def _parts(root: str, count: int) -> None:
    """`count` part folders below `root`, each an index.json of two entries (no shard files: merging reads
    none), written straight to the store."""
    store = open_store(root)
    for p in range(count):
        index = {"shards": [_entry(f"shard.{i:05d}.mds", 1) for i in range(2)], "version": 2}
        store.put(f"part{p:04d}/index.json", json.dumps(index, sort_keys=p % 2 == 0).encode())


def test_merge_fetches_the_parts_in_parallel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four part indexes whose GETs each wait until all four are in flight: a merge that fetched one at a
    time would break the barrier (it times out)."""
    _parts(str(tmp_path), 4)
    barrier = threading.Barrier(4, timeout=30)
    get = LocalStore.get

    def get_together(self: LocalStore, key: str) -> bytes:
        if key == "index.json":
            barrier.wait()
        return get(self, key)

    monkeypatch.setattr(LocalStore, "get", get_together)
    assert merge_parts(None, str(tmp_path)).num_samples == 8


@pytest.mark.s3
def test_parallel_merge_of_200_parts_on_s3_equals_the_serial_one(s3_bucket: str) -> None:
    _parts(f"{s3_bucket}/ds", 200)
    store = open_store(f"{s3_bucket}/ds")
    merged = merge_parts(None, store.url, concurrency=1)
    serial = store.get("index.json")
    assert len(merged.shards) == 400 and merged.shards[2].raw_data.basename == "part0001/shard.00000.mds"
    assert merge_parts(None, store.url).num_samples == 400
    assert store.get("index.json") == serial
    assert json.loads(serial)["shards"][399]["raw_data"]["basename"] == "part0199/shard.00001.mds"
