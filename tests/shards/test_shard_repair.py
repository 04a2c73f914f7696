"""repair_index rebuilds a lost index.json from the shard files, byte for byte."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from shard_helpers import MIXED_COLUMNS, mixed_sample

from tessera.shards import DatasetExists, MDSDataset, ShardWriter, TruncatedShard, repair_index
from tessera.shards.compression import parse_compression
from tessera.storage import open_store


@pytest.mark.parametrize(
    ("compression", "hashes"), [(None, None), (None, ["sha1", "xxh64"]), ("zstd:5", ["md5"]), ("snappy", None)]
)
def test_repair_reproduces_the_lost_index(make_dataset, compression: str | None, hashes: list | None) -> None:
    folder = make_dataset(120, size_limit=1500, compression=compression, hashes=hashes)
    original = (folder / "index.json").read_bytes()
    (folder / "index.json").unlink()
    report = repair_index(folder)
    assert report.written and not report.skipped
    assert (folder / "index.json").read_bytes() == original


def test_repair_uses_raw_copies_left_next_to_compressed_shards(make_dataset) -> None:
    folder = make_dataset(60, size_limit=1500, compression="zstd", hashes=["xxh3_64"])
    original = (folder / "index.json").read_bytes()
    for path in folder.glob("*.zstd"):
        path.with_suffix("").write_bytes(parse_compression("zstd").decompress(path.read_bytes()))
    (folder / "index.json").unlink()
    repair_index(folder)
    assert (folder / "index.json").read_bytes() == original


def test_repair_refuses_to_replace_an_index_unless_asked(make_dataset) -> None:
    folder = make_dataset(10)
    with pytest.raises(DatasetExists, match="overwrite=True"):
        repair_index(folder)
    assert repair_index(folder, overwrite=True).index.num_samples == 10
    assert repair_index(folder, dry_run=True).written is False


def test_bad_shards_raise_or_are_skipped(make_dataset) -> None:
    folder = make_dataset(100, size_limit=1500)
    (folder / "index.json").unlink()
    victim = folder / "shard.00001.mds"
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(TruncatedShard, match="shard.00001.mds"):
        repair_index(folder)
    report = repair_index(folder, skip_bad=True)
    assert [url for url, _ in report.skipped] == [str(victim)]
    assert all(entry.raw_data.basename != "shard.00001.mds" for entry in report.index.shards)
    ds = MDSDataset(folder)
    assert len(ds) == report.index.num_samples < 100


def test_repair_remote_dataset_with_sub_folders(tmp_path: Path) -> None:
    url = f"memory://repair-{uuid.uuid4().hex[:8]}"
    for part in ("a", "b"):
        with ShardWriter(f"{url}/{part}", MIXED_COLUMNS, size_limit=1500, compression="br:2") as writer:
            for i in range(40):
                writer.write(mixed_sample(i if part == "a" else 100 + i))
    store = open_store(url)
    store.delete("a/index.json")
    store.delete("b/index.json")
    report = repair_index(url)
    assert [e.raw_data.basename.split("/")[0] for e in report.index.shards].count("a") > 1
    ids = [s["id"] for s in MDSDataset(url, cache_dir=tmp_path / "cache")]
    assert ids == list(range(40)) + list(range(100, 140))
