"""ShardReader: the MDS.md byte layout, zero-copy views, batches, and typed errors for bad shards."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shard_helpers import MIXED_COLUMNS, mixed_sample, read_json

from tessera.shards import (
    CorruptShard,
    HashMismatch,
    ShardEntry,
    ShardFormatError,
    ShardReader,
    ShardWriter,
    TruncatedShard,
    UnknownEncoding,
    UnsafeEncoding,
)


def open_shard(folder: Path, shard: int = 0, **kwargs: object) -> ShardReader:
    entry = ShardEntry.from_json(read_json(folder / "index.json")["shards"][shard], str(folder / "index.json"), shard)
    return ShardReader(folder / entry.raw_data.basename, entry, shard=shard, **kwargs)


def entry_of(folder: Path, shard: int = 0) -> ShardEntry:
    return ShardEntry.from_json(read_json(folder / "index.json")["shards"][shard], "index.json", shard)


def test_worked_example_from_mds_md(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, {"b": "bytes", "n": "uint8"}, size_limit=None) as writer:
        writer.write({"b": b"abc", "n": 7})
    data = (tmp_path / "shard.00000.mds").read_bytes()
    config = (b'{"column_encodings": ["bytes", "uint8"], "column_names": ["b", "n"], "column_sizes": [null, 1], '
              b'"compression": null, "format": "mds", "hashes": [], "size_limit": null, "version": 2}')
    assert len(config) == 181
    assert data == bytes.fromhex("01000000 c1000000 c9000000") + config + bytes.fromhex("03000000 616263 07")
    reader = ShardReader(tmp_path / "shard.00000.mds")  # no entry: columns come from the embedded config
    assert reader.get(0) == {"b": b"abc", "n": 7}
    assert reader.config["column_names"] == ["b", "n"]


def test_get_and_column_selection(make_dataset) -> None:
    folder = make_dataset(50)
    reader = open_shard(folder)
    assert len(reader) == 50
    for i in (0, 13, 49):
        sample, expected = reader.get(i), mixed_sample(i)
        assert sample.keys() == expected.keys()
        assert sample["id"] == expected["id"] and sample["text"] == expected["text"]
        assert np.array_equal(sample["tokens"], expected["tokens"]) and sample["blob"] == expected["blob"]
        assert sample["score"] == expected["score"]
    only = open_shard(folder, columns=["tokens", "text"])
    assert set(only.get(5)) == {"tokens", "text"} and only.columns == ["text", "tokens"]
    with pytest.raises(IndexError):
        reader.get(50)
    with pytest.raises(KeyError, match="no columns"):
        open_shard(folder, columns=["nope"])


def test_fixed_columns_decode_as_views_of_the_mapping(make_dataset) -> None:
    folder = make_dataset(20, {"tokens": "ndarray:uint16:4", "label": "int"},
                          lambda i: {"tokens": np.full(4, i, np.uint16), "label": i})
    reader = open_shard(folder)
    mapped = np.frombuffer(reader._mm, np.uint8)
    tokens = reader.get(3)["tokens"]
    assert np.shares_memory(tokens, mapped) and not tokens.flags.writeable
    view = reader.column_view("tokens")
    assert view.shape == (20, 4) and np.shares_memory(view, mapped)
    assert np.array_equal(view[:, 0], np.arange(20))
    batch = reader.get_batch(slice(2, 6))
    assert np.shares_memory(batch["tokens"], mapped)  # a slice is zero-copy
    assert np.array_equal(batch["label"], [2, 3, 4, 5])
    picked = reader.get_batch([7, 1, 7])
    assert picked["tokens"].shape == (3, 4) and np.array_equal(picked["label"], [7, 1, 7])


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(indices=st.lists(st.integers(0, 39), max_size=20))
def test_batch_equals_per_sample_decoding(tmp_path_factory, indices: list[int]) -> None:
    folder = tmp_path_factory.getbasetemp() / "batch-equals"
    if not (folder / "index.json").exists():
        with ShardWriter(folder, MIXED_COLUMNS) as writer:
            for i in range(40):
                writer.write(mixed_sample(i))
    reader = open_shard(folder)
    batch = reader.get_batch(indices)
    for position, i in enumerate(indices):
        sample = reader.get(i)
        for name in MIXED_COLUMNS:
            assert np.array_equal(np.asarray(batch[name][position]), np.asarray(sample[name]))
    assert isinstance(batch["tokens"], np.ndarray) and batch["tokens"].shape == (len(indices), 4)
    assert isinstance(batch["id"], np.ndarray) and isinstance(batch["text"], list)


def test_zero_sample_shard(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, {"x": "bytes"}, size_limit=250) as writer:
        writer.write({"x": b"y" * 400})  # larger than the limit: MDS cuts an empty shard first
    index = read_json(tmp_path / "index.json")
    assert [s["samples"] for s in index["shards"]] == [0, 1]
    empty = open_shard(tmp_path, 0)
    assert len(empty) == 0 and empty.get_batch([]) == {"x": []}
    assert open_shard(tmp_path, 1).get(0) == {"x": b"y" * 400}


# --- bad input ---------------------------------------------------------------------------------------


@pytest.fixture
def shard(make_dataset) -> tuple[Path, ShardEntry]:
    folder = make_dataset(10, hashes=["sha256", "xxh64"])
    return folder / "shard.00000.mds", entry_of(folder)


@pytest.mark.parametrize("keep", [0, 6, 30, -1])
def test_truncated_shard(shard, keep: int) -> None:
    path, entry = shard
    data = path.read_bytes()
    path.write_bytes(data[: keep if keep >= 0 else len(data) - 1])
    for with_entry in (entry, None):
        with pytest.raises(TruncatedShard) as err:
            ShardReader(path, with_entry, shard=4)
        assert str(path) in str(err.value)
    assert isinstance(err.value, ShardFormatError)


def test_offsets_out_of_range(shard) -> None:
    path, entry = shard
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4 + 4 * 3, 5)  # off[3] points into the header
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptShard, match="out of range or out of order") as err:
        ShardReader(path, entry, shard=0)
    assert err.value.file == str(path) and err.value.shard == 0


def test_trailing_bytes_are_refused(shard) -> None:
    path, _ = shard
    path.write_bytes(path.read_bytes() + b"junk")
    with pytest.raises(CorruptShard, match="but the file has"):
        ShardReader(path)


def test_size_differs_from_index(shard) -> None:
    path, entry = shard
    data = bytearray(path.read_bytes())
    (count,) = struct.unpack_from("<I", data, 0)
    struct.pack_into("<I", data, 4 + 4 * count, len(data) + 4)
    path.write_bytes(bytes(data) + b"\0\0\0\0")
    with pytest.raises(CorruptShard, match="index.json records"):
        ShardReader(path, entry)


def test_hash_mismatch_only_when_verifying(shard) -> None:
    path, entry = shard
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # flip a payload byte: structure intact, digests wrong
    path.write_bytes(bytes(data))
    ShardReader(path, entry).get(9)  # verification is optional on read
    with pytest.raises(HashMismatch, match="sha256 digest") as err:
        ShardReader(path, entry, verify_hashes=True, shard=0)
    assert str(path) in str(err.value)


def test_sample_sizes_that_do_not_add_up(shard) -> None:
    path, entry = shard
    data = bytearray(path.read_bytes())
    begin = struct.unpack_from("<I", data, 4 + 4 * 2)[0]
    struct.pack_into("<I", data, begin, 10_000)  # the first variable column's size header of sample 2
    path.write_bytes(bytes(data))
    reader = ShardReader(path, entry, shard=0)
    with pytest.raises(CorruptShard, match="sample 2"):
        reader.get(2)
    with pytest.raises(CorruptShard):
        reader.get_batch([1, 2])
    assert reader.get(1)["id"] == 1


def _rewrite_encoding(path: Path, entry: ShardEntry, column: str, encoding: str) -> ShardEntry:
    """Change one column's encoding in both the entry and the embedded config (same byte length)."""
    obj = entry.to_json()
    obj["column_encodings"][obj["column_names"].index(column)] = encoding
    data = path.read_bytes()
    old = json.dumps(entry.config(), sort_keys=True).encode()
    new = json.dumps(ShardEntry.from_json(obj, "x").config(), sort_keys=True).encode()
    assert len(old) == len(new)
    path.write_bytes(data.replace(old, new))
    return ShardEntry.from_json(obj, "x")


def test_unknown_encoding_fails_at_decode_naming_column(shard) -> None:
    path, entry = shard
    entry = _rewrite_encoding(path, entry, "text", "wxy")
    reader = ShardReader(path, entry, shard=0)
    with pytest.raises(UnknownEncoding) as err:
        reader.get(1)
    assert err.value.column == "text" and err.value.encoding == "wxy" and str(path) in str(err.value)
    with pytest.raises(UnknownEncoding):
        reader.get_batch([0])
    assert ShardReader(path, entry, columns=["id", "tokens"]).get(3)["id"] == 3  # other columns still read


def test_pickle_needs_opt_in(make_dataset) -> None:
    folder = make_dataset(3, {"obj": "pkl", "n": "int"}, lambda i: {"obj": {"i": i}, "n": i})
    with pytest.raises(UnsafeEncoding, match="allow_unsafe_types=True") as err:
        open_shard(folder, shard=0)
    assert err.value.column == "obj" and "shard.00000.mds" in err.value.file
    assert open_shard(folder, allow_unsafe_types=True).get(2) == {"obj": {"i": 2}, "n": 2}
    assert open_shard(folder, columns=["n"]).get(1) == {"n": 1}


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ShardFormatError, match="missing"):
        ShardReader(tmp_path / "nope.mds")
    (tmp_path / "empty.mds").write_bytes(b"")
    with pytest.raises(TruncatedShard, match="empty"):
        ShardReader(tmp_path / "empty.mds")


def test_sample_count_must_match_index(shard) -> None:
    path, entry = shard
    obj = entry.to_json()
    obj["samples"] = 11
    with pytest.raises(CorruptShard, match="holds 10 samples"):
        ShardReader(path, ShardEntry.from_json(obj, "x"))


def test_embedded_config_must_agree_with_index(shard) -> None:
    path, entry = shard
    obj = entry.to_json()
    obj["column_encodings"][obj["column_names"].index("text")] = "json"
    with pytest.raises(CorruptShard, match="embedded in the shard"):
        ShardReader(path, ShardEntry.from_json(obj, "x"))
