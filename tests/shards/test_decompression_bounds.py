"""Decompression is streamed and capped at the raw size index.json declares, for every codec.

A bomb (64 MiB of zeros compressed to a few KB, in a shard whose index entry declares 1 MiB) is an error
naming the shard and both sizes, and the reading process's peak memory grows by far less than the
inflated size (measured as ru_maxrss of a fresh subprocess: a size, not a timing). Streamed output is
byte-identical to the whole-buffer codec for any chunk size, and a stream one byte longer than its cap
is refused.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shard_helpers import read_json
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import MDSDataset, ShardWriter
from tessera.shards.compression import InflateLimitError, parse_compression
from tessera.shards.errors import CorruptShard

CODECS = ["zstd", "gz:1", "bz2:1", "br:1", "snappy"]
INFLATED = 64 << 20
DECLARED = 1 << 20


def bomb_dataset(folder: Path, compression: str) -> str:
    """A real one-shard dataset whose compressed file is replaced by a bomb; returns the bomb's name."""
    with ShardWriter(folder, {"n": "int"}, compression=compression) as writer:
        writer.write({"n": 1})
    index = read_json(folder / "index.json")
    entry = index["shards"][0]
    bomb = parse_compression(compression).compress(bytes(INFLATED))
    name = entry["zip_data"]["basename"]
    (folder / name).write_bytes(bomb)
    entry["zip_data"].update(bytes=len(bomb))
    entry["raw_data"].update(bytes=DECLARED)
    (folder / "index.json").write_text(json.dumps(index, sort_keys=True))
    return name


MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    import brotli, snappy  # codec modules load before the baseline
    from tessera.shards import MDSDataset
    from tessera.shards.errors import CorruptShard
    folder, cache = sys.argv[1], sys.argv[2]
    ds = MDSDataset(folder, cache_dir=cache)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        ds[0]
        error = None
    except CorruptShard as exc:
        error = str(exc)
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"error": error, "grew_bytes": grew * 1024}))
    """
)


@pytest.mark.parametrize("compression", CODECS)
def test_a_bomb_is_refused_with_bounded_memory(tmp_path: Path, compression: str) -> None:
    folder = tmp_path / "ds"
    name = bomb_dataset(folder, compression)
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(folder), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["error"] is not None and name in result["error"]
    assert f"decompresses to more than the {DECLARED} bytes index.json records" in result["error"]
    assert "a corrupt shard or a decompression bomb" in result["error"]
    assert result["grew_bytes"] < INFLATED // 4, result  # O(chunk), not O(inflated size)
    assert not list((tmp_path / "cache").rglob("*.mds*"))  # nothing partial left in the cache


def test_verify_reports_a_bomb(tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    name = bomb_dataset(folder, "gz:1")
    res = CliRunner().invoke(app, ["data", "verify", str(folder)])
    assert res.exit_code == 1
    assert f"{name} (shard 0): decompresses to more than the {DECLARED} bytes" in res.output


@pytest.mark.parametrize("compression", CODECS)
def test_truncated_or_garbage_streams_name_the_shard(tmp_path: Path, compression: str) -> None:
    folder = tmp_path / "ds"
    with ShardWriter(folder, {"s": "str"}, compression=compression) as writer:
        for i in range(50):
            writer.write({"s": f"sample {i} " * 20})
    index = read_json(folder / "index.json")
    name = index["shards"][0]["zip_data"]["basename"]
    whole = (folder / name).read_bytes()
    for broken in (whole[: len(whole) // 2], b"\x00garbage" * (len(whole) // 8 + 1)):
        (folder / name).write_bytes(broken)
        index["shards"][0]["zip_data"].update(bytes=len(broken))
        (folder / "index.json").write_text(json.dumps(index, sort_keys=True))
        pattern = rf"{name} \(shard 0\): (cannot decompress as {compression}: \w+|decompresses to \d+ bytes but)"
        with pytest.raises(CorruptShard, match=pattern):
            MDSDataset(folder, cache_dir=tmp_path / "cache")[0]


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=5000) | st.builds(lambda n, b: bytes([b]) * n, st.integers(0, 300_000),
                                                     st.integers(0, 255)),
       family=st.sampled_from(CODECS), chunk=st.integers(1, 70_000))
def test_streamed_equals_whole_and_the_cap_is_exact(data: bytes, family: str, chunk: int) -> None:
    codec = parse_compression(family)
    packed = codec.compress(data)
    assert b"".join(codec.inflate(io.BytesIO(packed), len(data), chunk)) == data
    if data:
        with pytest.raises(InflateLimitError, match=f"more than {len(data) - 1} bytes"):
            b"".join(codec.inflate(io.BytesIO(packed), len(data) - 1, chunk))
