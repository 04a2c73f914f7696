"""Compressed datasets read from a local folder with no remote (or with remote == local), as MosaicML does.

The folder is the only copy of the data: each shard is decompressed next to its compressed file on
first use, the compressed file always stays (whatever keep_zip says), nothing is evicted, and a raw file
left from an earlier version of the dataset is never served.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import helpers
import numpy as np
import pytest
import zstandard
from anchors import MDSWriter

from tessera.shards import MDSDataset
from tessera.shards.errors import ShardFormatError, TruncatedShard
from tessera.storage.state_folder import state_folder
from tessera.stream import Stream, StreamingDataLoader, StreamingDataset

N = 120


def write_mosaic(out: Path, ids: range, compression: str = "zstd") -> None:
    """A compressed dataset written by MosaicML's own writer."""
    with MDSWriter(out=str(out), columns={"id": "int", "x": "ndarray:int64:4", "s": "str"},
                   compression=compression, size_limit=1400) as writer:
        for i in ids:
            writer.write({"id": i, "x": helpers.expected_x(i), "s": helpers.expected_s(i)})


def entries(folder: Path) -> list[dict]:
    return json.loads((folder / "index.json").read_text())["shards"]


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every compressed shard file, by name."""
    return {e["zip_data"]["basename"]: hashlib.sha256((folder / e["zip_data"]["basename"]).read_bytes()).hexdigest()
            for e in entries(folder)}


def read_ids(**kwargs) -> set[int]:
    """The ids of one epoch (as a set: padding to even out lanes is section 4's business, not ours)."""
    ds = StreamingDataset(batch_size=8, shuffle=True, **kwargs)
    out = set()
    for sample in ds:
        i = int(sample["id"])
        assert np.array_equal(sample["x"], helpers.expected_x(i)) and sample["s"] == helpers.expected_s(i)
        out.add(i)
    return out


@pytest.mark.parametrize("compression", ["zstd", "gz:1"])
def test_local_only_compressed_dataset_reads_and_keeps_its_compressed_files(tmp_path: Path, compression: str) -> None:
    data = tmp_path / "data"
    write_mosaic(data, range(N), compression)
    before = digests(data)
    assert len(before) > 3 and not any((data / e["raw_data"]["basename"]).exists() for e in entries(data))
    assert (read_ids(local=str(data), keep_zip=False)) == set(range(N))
    assert digests(data) == before  # the only copy is untouched, keep_zip=False notwithstanding
    for e in entries(data):  # raw files appear next to them, byte for byte the decompressed shard
        raw = (data / e["raw_data"]["basename"]).read_bytes()
        assert len(raw) == e["raw_data"]["bytes"]
        if compression == "zstd":
            assert raw == zstandard.ZstdDecompressor().decompress((data / e["zip_data"]["basename"]).read_bytes())
    assert not [p for p in data.rglob("*") if ".tmp" in p.name or p.name.startswith(".shard")]
    assert (read_ids(local=str(data))) == set(range(N))  # second read: from the raw files


def test_remote_equal_to_local_keeps_compressed_files_and_evicts_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_mosaic(data, range(N))
    before = digests(data)
    biggest = max(e["raw_data"]["bytes"] + e["zip_data"]["bytes"] for e in entries(data))
    assert read_ids(remote=str(data), local=str(data), keep_zip=False, cache_limit=2 * biggest) == set(range(N))
    assert digests(data) == before
    assert all((data / e["raw_data"]["basename"]).exists() for e in entries(data))  # none evicted


def test_dataloader_workers_share_the_decompression(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_mosaic(data, range(N))
    ds = StreamingDataset(local=str(data), batch_size=4, shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2)
    ids = [int(i) for batch in loader for i in batch["id"]]
    assert set(ids) == set(range(N))
    names = {p.name for p in data.iterdir()}
    assert names == {"index.json"} | {e["raw_data"]["basename"] for e in entries(data)} | {
        e["zip_data"]["basename"] for e in entries(data)}


def test_dataset_rewritten_in_place_is_decompressed_again(tmp_path: Path) -> None:
    data, other = tmp_path / "data", tmp_path / "other"
    for folder, base in ((data, 0), (other, 5000)):  # fixed-size samples: the raw files match in size
        with MDSWriter(out=str(folder), columns={"id": "int"}, compression="zstd", size_limit=300) as writer:
            for i in range(base, base + N):
                writer.write({"id": i})
    assert [e["raw_data"]["bytes"] for e in entries(data)] == [e["raw_data"]["bytes"] for e in entries(other)]
    assert {int(x["id"]) for x in StreamingDataset(local=str(data), batch_size=4)} == set(range(N))
    for e in entries(other):  # a new version of the dataset lands over the old one; stale raw files stay
        shutil.copyfile(other / e["zip_data"]["basename"], data / e["zip_data"]["basename"])
    shutil.copyfile(other / "index.json", data / "index.json")
    assert {int(x["id"]) for x in StreamingDataset(local=str(data), batch_size=4)} == set(range(5000, 5000 + N))


def test_raw_file_without_its_compressed_copy_is_served(tmp_path: Path) -> None:
    """A folder MosaicML left with keep_zip=False (raw files only) is still a dataset."""
    data = tmp_path / "data"
    write_mosaic(data, range(N))
    read_ids(local=str(data))
    shutil.rmtree(state_folder(data))
    for e in entries(data):
        (data / e["zip_data"]["basename"]).unlink()
    assert (read_ids(local=str(data))) == set(range(N))


def test_missing_shard_names_the_compressed_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_mosaic(data, range(N))
    gone = data / entries(data)[1]["zip_data"]["basename"]
    gone.unlink()
    with pytest.raises(FileNotFoundError, match=f"{gone}: compressed shard missing"):
        read_ids(local=str(data))


def test_truncated_compressed_shard_is_an_error_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_mosaic(data, range(N))
    bad = data / entries(data)[2]["zip_data"]["basename"]
    bad.write_bytes(bad.read_bytes()[:-7])
    with pytest.raises(TruncatedShard, match=str(bad)):
        read_ids(local=str(data))
    assert not (data / entries(data)[2]["raw_data"]["basename"]).exists()  # nothing half-written served


def test_validate_hash_checks_the_local_compressed_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with MDSWriter(out=str(data), columns={"id": "int"}, compression="zstd", hashes=["sha1"],
                   size_limit=200) as writer:
        for i in range(60):
            writer.write({"id": i})
    bad = data / entries(data)[0]["zip_data"]["basename"]
    blob = bytearray(bad.read_bytes())
    blob[-1] ^= 0xFF  # same size, different bytes
    bad.write_bytes(bytes(blob))
    with pytest.raises(ShardFormatError, match=str(bad)):
        list(StreamingDataset(local=str(data), batch_size=1, validate_hash="sha1"))


def test_local_compressed_stream_next_to_a_cache_limited_remote_stream(tmp_path: Path) -> None:
    remote, local_only = tmp_path / "remote", tmp_path / "local_only"
    helpers.write_elastic(remote, range(300), size_limit=4000)
    write_mosaic(local_only, range(10_000, 10_000 + N))
    before = digests(local_only)
    shard = max(e["raw_data"]["bytes"] for e in entries(remote))
    ds = StreamingDataset(streams=[Stream(remote=str(remote), local=str(tmp_path / "cache")),
                                   Stream(local=str(local_only))],
                          cache_limit=3 * shard, shuffle=True, batch_size=10, num_canonical_nodes=2)
    assert {int(x["id"]) for x in ds} == set(range(300)) | set(range(10_000, 10_000 + N))
    assert digests(local_only) == before
    assert all((local_only / e["raw_data"]["basename"]).exists() for e in entries(local_only))


def test_mds_dataset_reads_a_local_compressed_folder_without_touching_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_mosaic(data, range(N))
    listing = sorted(os.listdir(data))
    ds = MDSDataset(str(data), cache_dir=str(tmp_path / "cache"))
    assert [int(ds[i]["id"]) for i in range(len(ds))] == list(range(N))
    assert sorted(os.listdir(data)) == listing
