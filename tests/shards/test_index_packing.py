"""The packed index (shards/packed_index.py, index_bulk.py): the same entries as `DatasetIndex.from_json`,
the same errors, packed again when index.json changes, rebuilt when damaged, packed once by racing openers."""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.shards import index_bulk, packed_index
from tessera.shards.errors import IndexFormatError
from tessera.shards.index import DatasetIndex, check_basename, shard_key
from tessera.shards.index_bulk import scan
from tessera.shards.index_template import Irregular
from tessera.shards.index_values import safe_names
from tessera.shards.packed_index import _layout_key, open_packed, packed_location

MDS = {"column_encodings": ["int", "str"], "column_names": ["id", "s"], "column_sizes": [8, None],
       "compression": None, "format": "mds", "hashes": ["sha1", "xxh64"],
       "raw_data": {"basename": "shard.00000.mds", "bytes": 4000, "hashes": {"sha1": "ab" * 20, "xxh64": "cd" * 8}},
       "samples": 30, "size_limit": 4096, "version": 2, "zip_data": None}
ZSTD = {**MDS, "compression": "zstd:3", "hashes": [], "raw_data": {"basename": "z/s.0.mds", "bytes": 5000, "hashes": {}},
        "zip_data": {"basename": "z/s.0.mds.zstd", "bytes": 900, "hashes": {}}}
CSV = {"column_encodings": ["int", "str"], "column_names": ["a", "b"], "compression": None, "format": "csv",
       "hashes": [], "newline": "\n", "raw_data": {"basename": "t/shard.00000.csv", "bytes": 700, "hashes": {}},
       "raw_meta": {"basename": "t/shard.00000.csv.meta", "bytes": 100, "hashes": {}}, "samples": 10,
       "size_limit": None, "version": 2, "zip_data": None, "zip_meta": None}


def _entries(template: dict, n: int, name: str = "shard.{i:05}") -> list[dict]:
    out = []
    for i in range(n):
        e = copy.deepcopy(template)
        for key in ("raw_data", "zip_data", "raw_meta", "zip_meta"):
            if e.get(key):
                old = e[key]["basename"]
                e[key]["basename"] = old.replace("0", "", 1).replace("shard.", name.format(i=i) + ".") if "shard." in old \
                    else old.replace(".0.", f".{i}.")
                e[key]["bytes"] += i
        e["samples"] = template["samples"] + i % 3
        out.append(e)
    return out


def _write(folder: Path, entries: list[dict], ascii: bool = True, **top: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "index.json"
    path.write_text(json.dumps({**top, "shards": entries, "version": 2}, sort_keys=True, ensure_ascii=ascii))
    return path


def _same_as_loader(path: Path) -> None:
    packed = open_packed(path, str(path))
    want = DatasetIndex.from_json(path.read_bytes(), str(path))
    assert len(packed) == len(want.shards)
    assert list(packed) == want.shards
    assert packed.samples.tolist() == [e.samples for e in want.shards]
    assert packed.sample_base.tolist() == np.concatenate([[0], np.cumsum(packed.samples)]).tolist()
    assert packed.fingerprint == xxhash.xxh64(path.read_bytes()).hexdigest()
    assert packed.extensions == want.extensions
    firsts: dict[str, int] = {}
    for i, entry in enumerate(want.shards):
        firsts.setdefault(_layout_key(entry), i)
    assert [shard for shard, _ in packed.layout_shards()] == sorted(firsts.values())  # (from the header)


def _bulk(path: Path) -> bool:
    """Whether the bulk reader takes this index (else packing parsed it whole)."""
    try:
        with open(path, "rb") as file:
            scan(file, "x", lambda block, templates: None, xxhash.xxh64())
    except Irregular:
        return False
    return True


@pytest.mark.parametrize("layouts", [[MDS], [ZSTD], [CSV], [MDS, ZSTD, CSV]])
def test_packed_entries_equal_the_loaders(tmp_path: Path, layouts: list[dict]) -> None:
    entries = [e for k, t in enumerate(layouts) for e in _entries(t, 40, name=f"L{k}" + ".{i:05}")]
    entries.insert(3, entries.pop())  # a layout seen again later
    path = _write(tmp_path, entries, provenance={"by": "test"})
    assert _bulk(path)
    _same_as_loader(path)


@pytest.mark.parametrize("chunk", [97, 1000, 4096])
def test_entries_found_by_quotes_across_small_chunks_equal_the_loaders(tmp_path: Path, chunk: int,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a few entries: after the first entries, entries are found by their quotes (a new
    layout appearing mid-file, entries cut by chunk edges), and the text after the array by brackets."""
    monkeypatch.setattr(index_bulk, "CHUNK", chunk)
    found = []
    by_quotes = index_bulk._Walk._by_quotes
    monkeypatch.setattr(index_bulk._Walk, "_by_quotes", lambda walk: found.append(by_quotes(walk)) or found[-1])
    entries = _entries(MDS, 60) + _entries(CSV, 30, name="c{i:03}") + _entries(ZSTD, 5)
    path = _write(tmp_path / "mixed", entries, zz=[{"a": 1}, {"b": [2]}], provenance={"by": "x"})
    assert _bulk(path)
    assert found.count(True) >= 3  # (then brackets for the objects in "zz" after the array)
    _same_as_loader(path)
    pretty = tmp_path / "pretty" / "index.json"
    pretty.parent.mkdir()
    pretty.write_text(json.dumps({"shards": _entries(MDS, 30), "version": 2}, indent=2))
    found.clear()
    assert _bulk(pretty)
    assert False in found  # not the writers' layout: by brackets
    _same_as_loader(pretty)


def test_unusual_but_valid_indexes_are_packed_whole(tmp_path: Path) -> None:
    odd = _entries(MDS, 5)
    odd[2]["raw_data"]["basename"] = "./sub//shard.x.mds"  # valid; its key is sub/shard.x.mds
    odd[3]["raw_data"]["basename"] = "dé/shard.3.mds"
    odd.append({**ZSTD, "raw_data": {**ZSTD["raw_data"], "basename": "same.mds"},
                "zip_data": {**ZSTD["zip_data"], "basename": "same.mds"}})  # one shard naming a file twice
    path = _write(tmp_path / "a", odd, ascii=False)
    assert _bulk(path)  # names outside the bulk rule go through check_basename one by one
    _same_as_loader(path)
    escaped_name = _write(tmp_path / "e", odd)  # "d\u00e9/...": an escape in a value, parsed whole
    assert not _bulk(escaped_name)
    _same_as_loader(escaped_name)
    pretty = tmp_path / "b" / "index.json"
    pretty.parent.mkdir()
    pretty.write_text(json.dumps({"shards": _entries(MDS, 6), "version": 2}, indent=2))
    assert _bulk(pretty)
    _same_as_loader(pretty)
    escaped = tmp_path / "c" / "index.json"
    escaped.parent.mkdir()
    escaped.write_text(json.dumps({"shards": _entries(MDS, 3), "version": 2, "note": 'a\\"b'}))
    assert not _bulk(escaped)  # an escaped quote: parsed whole, same result
    _same_as_loader(escaped)


def _error(path: Path) -> str:
    with pytest.raises(IndexFormatError) as packed:
        open_packed(path, "L")
    with pytest.raises(IndexFormatError) as loader:
        DatasetIndex.from_json(path.read_bytes(), "L")
    assert type(packed.value) is type(loader.value)
    assert str(packed.value) == str(loader.value)
    return str(packed.value)


@pytest.mark.parametrize("chunk", [300, 4 << 20])
def test_bad_indexes_fail_with_the_loaders_error(tmp_path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_bulk, "CHUNK", chunk)  # (small: the bad entry is reached by quotes)
    cases: dict[str, list[dict]] = {}
    big = _entries(MDS, 8)
    big[5]["samples"] = 2**31
    cases["samples"] = big
    twice = _entries(MDS, 8)
    twice[6]["raw_data"]["basename"] = twice[2]["raw_data"]["basename"]
    cases["twice"] = twice
    climb = _entries(MDS, 8)
    climb[4]["raw_data"]["basename"] = "../x.mds"
    cases["climb"] = climb
    hidden = _entries(MDS, 8)
    hidden[7]["samples"] = 0
    cases["hidden"] = hidden
    fits = _entries(MDS, 8)
    fits[1]["raw_data"]["bytes"] = 20
    cases["fits"] = fits
    key = _entries(MDS, 8)
    key[3]["extra"] = 1
    cases["key"] = key
    for name, entries in cases.items():
        assert "shard" in _error(_write(tmp_path / name, entries)), name
    broken = tmp_path / "broken" / "index.json"
    broken.parent.mkdir()
    broken.write_text('{"shards": [' + json.dumps(MDS) + ", ")
    _error(broken)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab./_-\\:é\x00", max_size=12))
def test_names_the_bulk_rule_takes_are_ones_check_basename_takes_unchanged(name: str) -> None:
    raw = np.frombuffer(name.encode(), np.uint8)
    if not safe_names(raw, np.array([raw.size]))[0]:
        return
    assert check_basename(name, "x") == name
    assert shard_key(name) == name


def test_a_changed_index_is_packed_again(tmp_path: Path) -> None:
    path = _write(tmp_path, _entries(MDS, 20))
    assert len(open_packed(path, "x")) == 20
    _write(tmp_path, _entries(MDS, 12))
    again = open_packed(path, "x")
    assert len(again) == 12
    _same_as_loader(path)


@pytest.mark.parametrize("damage", ["magic", "byte", "truncate", "empty"])
def test_a_damaged_packed_file_is_rebuilt(tmp_path: Path, damage: str) -> None:
    path = _write(tmp_path, _entries(MDS, 50))
    open_packed(path, "x")
    packed = packed_location(path, beside=False)
    good = packed.read_bytes()
    data = bytearray(good)
    if damage == "magic":
        data[0] ^= 1
    elif damage == "byte":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[:-100]
    else:
        data = bytearray()
    packed.write_bytes(bytes(data))
    _same_as_loader(path)
    assert packed.read_bytes() == good  # rebuilt: the same bytes again


def _open_count(path: str) -> int:
    return len(open_packed(Path(path), "x"))


def test_racing_first_openers_agree_and_leave_one_whole_file(tmp_path: Path) -> None:
    path = _write(tmp_path, _entries(ZSTD, 3000))
    ctx = multiprocessing.get_context("forkserver")   # fresh processes: a fork of a test process with threads may hang
    with ctx.Pool(4) as pool:
        counts = pool.map(_open_count, [str(path)] * 8)
    assert counts == [3000] * 8
    packed = packed_location(path, beside=False)
    assert sorted(p.name for p in packed.parent.iterdir()) == [packed.name, packed.name + ".lock", "source"]  # no temp
    _same_as_loader(path)


def test_packed_indexes_of_local_datasets_under_the_temp_dir_are_bounded(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(packed_index, "KEEP_PACKED", 2)
    paths = [_write(tmp_path / f"d{i}", _entries(MDS, 5)) for i in range(4)]
    folder = [packed_location(path, beside=False).parent for path in paths]
    for path in paths[:2]:
        open_packed(path, "x")
    os.utime(folder[0], (1e9, 1e9))
    os.utime(folder[1], (1e9 + 1, 1e9 + 1))
    assert len(open_packed(paths[0], "x")) == 5  # used again: the most recent
    open_packed(paths[2], "x")  # a third: the least recently used (d1) goes
    assert sorted(f.name for f in folder[0].parent.iterdir()) == sorted([folder[0].name, folder[2].name])
    paths[0].unlink()  # d0's index.json is gone: its packed form goes at the next packing, however recent
    open_packed(paths[3], "x")
    assert sorted(f.name for f in folder[0].parent.iterdir()) == sorted([folder[2].name, folder[3].name])
    assert len(open_packed(paths[1], "x")) == 5  # (a removed one is packed again when next used)
