"""MDSDataset: indexing, batches across shards, compressed and remote datasets, typed errors."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
from shard_helpers import mixed_sample, read_json

from tessera.shards import (
    DatasetNotFound,
    HashMismatch,
    MDSDataset,
    PathTraversal,
    ShardFormatError,
    ShardWriter,
    TruncatedShard,
    UnsafeEncoding,
)
from tessera.storage import open_store


def ids(samples: list[dict]) -> list[int]:
    return [sample["id"] for sample in samples]


def test_indexing_slicing_iteration(make_dataset) -> None:
    folder = make_dataset(100, size_limit=1200)
    ds = MDSDataset(folder)
    assert len(ds) == 100 and ds.num_shards > 3
    assert ds[0]["id"] == 0 and ds[57]["text"] == mixed_sample(57)["text"] and ds[-1]["id"] == 99
    assert ids(ds[10:20]) == list(range(10, 20))
    assert ids(ds[95:200:2]) == [95, 97, 99]
    assert ids(ds[[5, 99, 0, 5]]) == [5, 99, 0, 5]
    assert ids(ds[np.array([3, 4])]) == [3, 4]
    assert ids(list(ds)) == list(range(100))
    for bad in (100, -101):
        with pytest.raises(IndexError):
            ds[bad]


def test_get_batch_across_shards_keeps_request_order(make_dataset) -> None:
    ds = MDSDataset(make_dataset(100, size_limit=1500))
    order = [99, 0, 50, 51, 1, 99, -1]
    batch = ds.get_batch(order)
    expected = [i % 100 for i in order]
    assert np.array_equal(batch["id"], expected) and batch["id"].dtype == np.int64
    assert np.array_equal(batch["tokens"], np.stack([mixed_sample(i)["tokens"] for i in expected]))
    assert batch["text"] == [mixed_sample(i)["text"] for i in expected]
    with pytest.raises(IndexError):
        ds.get_batch([100])


def test_get_batch_slice_in_one_shard_is_zero_copy(make_dataset) -> None:
    folder = make_dataset(64, {"tokens": "ndarray:int32:8"}, lambda i: {"tokens": np.full(8, i, np.int32)})
    ds = MDSDataset(folder)
    batch = ds.get_batch(slice(10, 30))
    mapped = np.frombuffer(ds.reader(0)._mm, np.uint8)
    assert np.shares_memory(batch["tokens"], mapped)
    assert np.array_equal(batch["tokens"][:, 0], np.arange(10, 30))


def test_column_selection(make_dataset) -> None:
    ds = MDSDataset(make_dataset(10), columns=["text"])
    assert ds[3] == {"text": "xxx"}
    assert ds.get_batch([1, 2]) == {"text": ["x", "xx"]}


def test_split_and_sub_folder_basenames(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with ShardWriter(root / "train", {"id": "int"}, size_limit=300) as writer:
        for i in range(30):
            writer.write({"id": i})
    # move the shards into a sub-folder, as datasets merged from parallel writers have them
    split = root / "train"
    index = read_json(split / "index.json")
    (split / "0").mkdir()
    for entry in index["shards"]:
        shutil.move(split / entry["raw_data"]["basename"], split / "0" / entry["raw_data"]["basename"])
        entry["raw_data"]["basename"] = "0/" + entry["raw_data"]["basename"]
    (split / "index.json").write_text(json.dumps(index, sort_keys=True))
    ds = MDSDataset(root, split="train")
    assert ids(list(ds)) == list(range(30))


def test_compressed_local_dataset_decompresses_into_the_cache(make_dataset, tmp_path: Path) -> None:
    folder = make_dataset(60, compression="zstd", size_limit=1500, hashes=["xxh3_64"])
    before = sorted(p.name for p in folder.iterdir())
    cache = tmp_path / "cache"
    ds = MDSDataset(folder, cache_dir=cache, verify_hashes=True)
    assert ids(list(ds)) == list(range(60))
    assert sorted(p.name for p in folder.iterdir()) == before  # the dataset folder is not written to
    assert len(list(cache.glob("shard.*.mds"))) == ds.num_shards
    again = MDSDataset(folder, cache_dir=cache)  # second open reuses the decompressed files
    assert again[59]["id"] == 59


def test_remote_dataset_fetches_only_the_shards_used(tmp_path: Path) -> None:
    url = f"memory://ds-{uuid.uuid4().hex[:8]}/data"
    with ShardWriter(url, {"id": "int", "text": "str"}, size_limit=400, compression="br:1") as writer:
        for i in range(80):
            writer.write({"id": i, "text": f"sample {i}"})
    cache = tmp_path / "cache"
    ds = MDSDataset(url, cache_dir=cache)
    assert ds[41]["text"] == "sample 41"
    assert len(list(cache.rglob("shard.*"))) == 1
    assert ids(list(ds)) == list(range(80))
    assert not list(cache.rglob("*.br"))  # downloaded compressed files are dropped after decompression


def test_pickle_column_refused_at_open(make_dataset) -> None:
    folder = make_dataset(4, {"obj": "pkl", "id": "int"}, lambda i: {"obj": [i], "id": i})
    with pytest.raises(UnsafeEncoding) as err:
        MDSDataset(folder)
    assert err.value.file.endswith("index.json") and err.value.column == "obj"
    assert MDSDataset(folder, columns=["id"])[3] == {"id": 3}
    assert MDSDataset(folder, allow_unsafe_types=True)[2]["obj"] == [2]


def test_traversal_basename_refused_at_open(make_dataset) -> None:
    folder = make_dataset(5)
    index = read_json(folder / "index.json")
    index["shards"][0]["raw_data"]["basename"] = "../../etc/passwd"
    (folder / "index.json").write_text(json.dumps(index))
    with pytest.raises(PathTraversal) as err:
        MDSDataset(folder)
    assert err.value.file == str(folder / "index.json") and err.value.shard == 0


def test_missing_dataset(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFound, match="no index.json"):
        MDSDataset(tmp_path)


def test_verify_hashes_on_open(make_dataset) -> None:
    folder = make_dataset(20, hashes=["md5"])
    path = folder / "shard.00000.mds"
    data = bytearray(path.read_bytes())
    data[-2] ^= 1
    path.write_bytes(bytes(data))
    assert MDSDataset(folder)[0]["id"] == 0
    with pytest.raises(HashMismatch) as err:
        MDSDataset(folder, verify_hashes=True)[0]
    assert err.value.shard == 0 and "shard.00000.mds" in err.value.file


def test_remote_truncated_and_missing_shards(tmp_path: Path) -> None:
    url = f"memory://ds-{uuid.uuid4().hex[:8]}"
    with ShardWriter(url, {"id": "int"}, size_limit=200) as writer:
        for i in range(40):
            writer.write({"id": i})
    store = open_store(url)
    store.put("shard.00000.mds", store.get("shard.00000.mds")[:-3])
    store.delete("shard.00001.mds")
    ds = MDSDataset(url, cache_dir=tmp_path / "cache")
    with pytest.raises(TruncatedShard, match="shard.00000.mds"):
        ds[0]
    with pytest.raises(ShardFormatError, match="missing"):
        ds.get(ds._starts[1])
    assert ds[-1]["id"] == 39


def test_empty_dataset(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, {"id": "int"}):
        pass
    assert read_json(tmp_path / "index.json") == {"shards": [], "version": 2}
    ds = MDSDataset(tmp_path)
    assert len(ds) == 0 and list(ds) == []


def test_pickles_for_dataloader_workers(make_dataset, tmp_path: Path) -> None:
    import pickle

    url = f"memory://pickle-{uuid.uuid4().hex[:8]}"
    with ShardWriter(url, {"id": "int"}, size_limit=200) as writer:
        for i in range(30):
            writer.write({"id": i})
    for ds in (MDSDataset(make_dataset(20)), MDSDataset(url, cache_dir=tmp_path / "c")):
        ds[5]  # an open reader (an mmap) must not travel
        clone = pickle.loads(pickle.dumps(ds))
        assert len(clone) == len(ds) and clone[-1]["id"] == ds[-1]["id"] and clone[3]["id"] == 3


def test_unknown_columns_are_refused_at_open(make_dataset) -> None:
    with pytest.raises(KeyError, match="no columns \\['nope'\\]"):
        MDSDataset(make_dataset(3), columns=["id", "nope"])
