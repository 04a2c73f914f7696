"""index.json from untrusted storage: any text parses to a valid index or fails with IndexFormatError.

An index is the one file a reader trusts before touching any shard, and it can come from anyone's bucket;
a RecursionError, OverflowError or TypeError there is a traceback for the user and, deeper down, numbers
(samples, bytes) that numpy cannot hold. So arbitrary JSON, valid indexes with one value replaced, and the
known hostile cases must all end in the shards layer's typed error naming the file, and `tessera data
verify|inspect` must then print one line and exit 1.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_shard_index import mds_entry
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import DatasetIndex, IndexFormatError, ShardWriter
from tessera.shards.index import MAX_BYTES, MAX_SAMPLES
from tessera.shards.session import JOURNAL_BASENAME, JOURNAL_KEY, plan_session
from tessera.storage import open_store

FILE = "/data/ds/index.json"

_MDS = mds_entry()
_TEXT = {
    "columns": {"text": "str"}, "compression": None, "format": "json", "hashes": [], "newline": "\n",
    "raw_data": {"basename": "shard.00001.json", "bytes": 30, "hashes": {}},
    "raw_meta": {"basename": "shard.00001.json.meta", "bytes": 16, "hashes": {}},
    "samples": 2, "size_limit": None, "version": 2, "zip_data": None, "zip_meta": None,
}
_XSV = {
    "column_encodings": ["str", "int"], "column_names": ["a", "b"], "compression": None, "format": "xsv",
    "hashes": ["md5"], "newline": "\n", "raw_data": {"basename": "shard.00002.xsv", "bytes": 40, "hashes": {}},
    "raw_meta": {"basename": "shard.00002.xsv.meta", "bytes": 24, "hashes": {}}, "samples": 3,
    "separator": ";", "size_limit": 1000, "version": 2, "zip_data": None, "zip_meta": None,
}
VALID = {"shards": [_MDS, _TEXT, _XSV], "version": 2, "tessera": {"note": "kept"}}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Numbers at and around the edges the parser must bound, and values of the wrong type.
edge_values = st.sampled_from([2**63, 2**64, -1, 2**40 + 1, 10**30, 1e400, -0.0, 1.5, True, "1", None, [], {},
                               "nohash", "../x", "/etc/passwd", "", [[]], {"a": []}, ["sha1", 3]])


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path of keys/positions into `obj`, so one value anywhere can be replaced."""
    found = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += _paths(value, (*prefix, i))
    return found


def _replace(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(obj)
    node = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return out


def _parse_or_typed_error(text: str | bytes) -> None:
    """Either a valid index whose numbers are bounded and which round-trips, or IndexFormatError."""
    try:
        index = DatasetIndex.from_json(text, FILE)
    except IndexFormatError as err:
        assert str(err).startswith(FILE), err
        return
    for entry in index.shards:
        assert 0 <= entry.samples <= MAX_SAMPLES
        assert all(0 <= info.bytes <= MAX_BYTES for info in entry.files)
        entry.empty_size()
    assert index.num_samples <= 2**62  # fits numpy's int64 with room for arithmetic
    assert DatasetIndex.from_json(index.to_json(), FILE).to_json() == index.to_json()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_arbitrary_json_is_an_index_or_a_typed_error(value: Any) -> None:
    _parse_or_typed_error(json.dumps(value))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_valid_index_with_one_value_replaced_is_an_index_or_a_typed_error(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(_paths(VALID)))
    value = data.draw(edge_values | json_values)
    _parse_or_typed_error(json.dumps(_replace(VALID, path, value)))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_arbitrary_bytes_are_an_index_or_a_typed_error(raw: bytes) -> None:
    _parse_or_typed_error(raw)


def _with(path: tuple, value: Any) -> str:
    return json.dumps(_replace(VALID, path, value))


HOSTILE = {
    "deep": ("[" * 200_000 + "]" * 200_000, "nested"),
    "deep_extension": (json.dumps(VALID)[:-1] + ', "x": ' + "{\"a\": " * 100_000 + "1" + "}" * 100_001, "nested"),
    "samples_2_63": (_with(("shards", 0, "samples"), 2**63), "samples"),
    "bytes_2_64": (_with(("shards", 0, "raw_data", "bytes"), 2**64), "raw_data.bytes"),
    "unknown_hash": (_with(("shards", 0, "hashes"), ["nohash"]), "hashes"),
    "unknown_file_hash": (_with(("shards", 0, "raw_data", "hashes"), {"nohash": "ab"}), "raw_data.hashes"),
    "format_list": (_with(("shards", 0, "format"), []), "format"),
    "column_size": (_with(("shards", 0, "column_sizes"), [None, 2**40]), "column_sizes"),
    "column_names_int": (_with(("shards", 2, "column_names"), 2**63), "column_names"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_indexes_are_refused_naming_file_and_key(name: str) -> None:
    text, key = HOSTILE[name]
    with pytest.raises(IndexFormatError) as info:
        DatasetIndex.from_json(text, FILE)
    assert str(info.value).startswith(FILE) and key in str(info.value)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz") / "ds"
    with ShardWriter(root, {"text": "str"}, hashes=["sha1"]) as writer:
        for i in range(3):
            writer.write({"text": f"sample {i}"})
    return root


def _cli_fails_in_one_line(command: str, root: Path) -> None:
    result = CliRunner().invoke(app, ["data", command, str(root)])
    output = result.output.strip()
    assert result.exit_code == 1, output
    assert "Traceback" not in output and isinstance(result.exception, SystemExit), output
    assert output.startswith("error:") and output.count("error:") == 1 and "problem" not in output, output
    assert str(root / "index.json") in "".join(output.split()), output  # rich wraps at 80 columns


@pytest.mark.parametrize("name", ["deep", "samples_2_63", "unknown_hash", "format_list", "bytes_2_64"])
@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_cli_refuses_a_hostile_index_in_one_line(dataset: Path, tmp_path: Path, name: str, command: str) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    for path in dataset.iterdir():
        (root / path.name).write_bytes(path.read_bytes())
    obj = json.loads((dataset / "index.json").read_text())
    text = {
        "deep": "[" * 200_000 + "]" * 200_000,
        "samples_2_63": json.dumps(_replace(obj, ("shards", 0, "samples"), 2**63)),
        "unknown_hash": json.dumps(_replace(obj, ("shards", 0, "raw_data", "hashes"), {"nohash": "ab"})),
        "format_list": json.dumps(_replace(obj, ("shards", 0, "format"), [])),
        "bytes_2_64": json.dumps(_replace(obj, ("shards", 0, "raw_data", "bytes"), 2**64)),
    }[name]
    (root / "index.json").write_text(text)
    _cli_fails_in_one_line(command, root)


@pytest.mark.parametrize("meta", [{"mode": "create", "base_shards": "x"}, {"mode": "create", "base_shards": 2**64},
                                  {"mode": "append", "replaces": 5}, {"mode": "create", "extensions": [1]}])
def test_a_malformed_write_journal_is_a_typed_error(tmp_path: Path, meta: dict) -> None:
    journal = tmp_path / JOURNAL_BASENAME
    journal.write_text(json.dumps({"shards": [], "version": 2, JOURNAL_KEY: meta}))
    with pytest.raises(IndexFormatError, match=f"{journal}: {JOURNAL_KEY}"):
        plan_session(open_store(str(tmp_path)), "resume")


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_cli_on_a_mutated_real_index_exits_0_or_1_without_a_traceback(dataset: Path, tmp_path_factory:
                                                                        pytest.TempPathFactory,
                                                                        data: st.DataObject) -> None:
    root = tmp_path_factory.mktemp("mutated") / "ds"
    root.mkdir()
    for path in dataset.iterdir():
        (root / path.name).write_bytes(path.read_bytes())
    obj = json.loads((dataset / "index.json").read_text())
    path = data.draw(st.sampled_from(_paths(obj)))
    (root / "index.json").write_text(json.dumps(_replace(obj, path, data.draw(edge_values | json_values))))
    for command in ("verify", "inspect"):
        result = CliRunner().invoke(app, ["data", command, str(root)])
        assert result.exit_code in (0, 1), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert "Traceback" not in result.output
