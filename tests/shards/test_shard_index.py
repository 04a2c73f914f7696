"""index.json model: exact key sets per shard entry, safe basenames, top-level extensions."""

from __future__ import annotations

import copy
import json

import pytest

from tessera.shards import DatasetIndex, IndexFormatError, PathTraversal, ShardEntry
from tessera.shards.index import ENTRY_KEYS, check_basename, shard_key

FILE = "/data/ds/index.json"


def mds_entry(**changes: object) -> dict:
    entry = {
        "column_encodings": ["bytes", "uint8"], "column_names": ["b", "n"], "column_sizes": [None, 1],
        "compression": "zstd:7", "format": "mds", "hashes": ["sha1", "xxh64"],
        "raw_data": {"basename": "shard.00000.mds", "bytes": 201, "hashes": {"sha1": "ab", "xxh64": "cd"}},
        "samples": 1, "size_limit": 67108864, "version": 2,
        "zip_data": {"basename": "shard.00000.mds.zstd", "bytes": 120, "hashes": {"sha1": "ef", "xxh64": "01"}},
    }
    entry.update(changes)
    return entry


def test_mds_entry_has_exactly_the_eleven_keys_and_roundtrips() -> None:
    assert len(ENTRY_KEYS["mds"]) == 11
    obj = mds_entry()
    entry = ShardEntry.from_json(obj, FILE, 0)
    assert entry.to_json() == obj
    assert entry.stored.basename == "shard.00000.mds.zstd"
    assert set(entry.config()) == set(obj) - {"samples", "raw_data", "zip_data"}


@pytest.mark.parametrize("key", sorted(ENTRY_KEYS["mds"]))
def test_missing_key_is_refused_naming_file_and_shard(key: str) -> None:
    obj = mds_entry()
    del obj[key]
    with pytest.raises(IndexFormatError) as err:
        ShardEntry.from_json(obj, FILE, 3)
    assert err.value.file == FILE and err.value.shard == 3
    assert FILE in str(err.value) and "shard 3" in str(err.value)


def test_extra_key_is_refused() -> None:
    with pytest.raises(IndexFormatError, match="extra keys \\['tessera'\\]"):
        ShardEntry.from_json(mds_entry(tessera={"x": 1}), FILE, 0)


@pytest.mark.parametrize(
    "raw_data",
    [{"basename": "a", "bytes": 1}, {"basename": "a", "bytes": 1, "hashes": {}, "x": 1}, {"basename": "a", "bytes": -1, "hashes": {}}],
)
def test_file_info_must_be_exact(raw_data: dict) -> None:
    with pytest.raises(IndexFormatError, match="raw_data"):
        ShardEntry.from_json(mds_entry(raw_data=raw_data), FILE, 0)


@pytest.mark.parametrize(
    "changes",
    [
        {"version": 1}, {"samples": -1}, {"samples": "3"}, {"compression": "lz4"}, {"zip_data": None},
        {"compression": None}, {"column_sizes": [None]}, {"column_names": ["b", "b"]}, {"format": "parquet"},
        {"hashes": "sha1"}, {"size_limit": "64mb"},
    ],
)
def test_malformed_entries(changes: dict) -> None:
    with pytest.raises(IndexFormatError):
        ShardEntry.from_json(mds_entry(**changes), FILE, 0)


@pytest.mark.parametrize(
    "basename", ["/etc/passwd", "../shard.00000.mds", "a/../../x.mds", "sub/../../x", "C:\\x.mds", "a\\..\\b", "d:x"]
)
def test_traversal_basenames_are_refused(basename: str) -> None:
    obj = mds_entry(raw_data={"basename": basename, "bytes": 1, "hashes": {}})
    with pytest.raises(PathTraversal, match="climbs out"):
        ShardEntry.from_json(obj, FILE, 0)
    obj = mds_entry()
    obj["zip_data"]["basename"] = basename
    with pytest.raises(PathTraversal):
        ShardEntry.from_json(obj, FILE, 0)


@pytest.mark.parametrize("basename", ["", None, 5])
def test_non_string_basenames_are_refused(basename: object) -> None:
    with pytest.raises(IndexFormatError):
        check_basename(basename, FILE)


def test_sub_folder_basenames_are_fine() -> None:
    assert check_basename("0/shard.00000.mds", FILE) == "0/shard.00000.mds"
    assert shard_key("./0//shard.00000.mds") == "0/shard.00000.mds"


def test_index_ignores_and_keeps_unknown_top_level_keys() -> None:
    text = json.dumps({"shards": [mds_entry()], "version": 2, "tessera": {"fingerprint": "x"}}, sort_keys=True)
    index = DatasetIndex.from_json(text, FILE)
    assert index.extensions == {"tessera": {"fingerprint": "x"}}
    assert index.num_samples == 1
    assert index.to_json() == text  # json.dumps(sort_keys=True), byte for byte


@pytest.mark.parametrize(
    "text", ["{", "[]", '{"shards": {}, "version": 2}', '{"shards": [], "version": 3}', '{"shards": []}', "\xff"]
)
def test_malformed_index(text: str) -> None:
    with pytest.raises(IndexFormatError) as err:
        DatasetIndex.from_json(text, FILE)
    assert err.value.file == FILE


def test_bad_entry_in_index_names_its_position() -> None:
    bad = mds_entry()
    del bad["size_limit"]
    text = json.dumps({"shards": [mds_entry(), bad], "version": 2})
    with pytest.raises(IndexFormatError) as err:
        DatasetIndex.from_json(text, FILE)
    assert err.value.shard == 1


def test_text_format_entries() -> None:
    base = {k: v for k, v in mds_entry(compression=None, zip_data=None).items()
            if k not in ("column_sizes", "column_names", "column_encodings")}
    meta = {"basename": "shard.00000.json.meta", "bytes": 30, "hashes": {}}
    json_entry = {**base, "format": "json", "columns": {"a": "str", "b": "int"}, "newline": "\n",
                  "raw_meta": meta, "zip_meta": None}
    entry = ShardEntry.from_json(json_entry, FILE, 0)
    assert entry.column_names == ["a", "b"] and entry.to_json() == json_entry
    csv_entry = {**base, "format": "csv", "column_names": ["a"], "column_encodings": ["int"], "newline": "\n",
                 "raw_meta": meta, "zip_meta": None}
    assert ShardEntry.from_json(csv_entry, FILE, 0).to_json() == csv_entry
    with pytest.raises(IndexFormatError, match="missing keys \\['separator'\\]"):
        ShardEntry.from_json({**copy.deepcopy(csv_entry), "format": "xsv"}, FILE, 0)
