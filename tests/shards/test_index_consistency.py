"""index.json entries that are each valid but wrong as a whole: every reader refuses them at load, and
`tessera data verify` names them (one line each, exit 1).

- a file listed by two entries would serve its samples twice (verify too refuses the index at once);
- `samples: 0` on a file that holds samples would hide them (verify lists it and checks every shard).
A real empty shard (MosaicML's quirk when the first sample is larger than the size limit) still reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from anchors import MDSWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shard_helpers import read_json
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import MDSDataset, ShardWriter
from tessera.shards.index import DatasetIndex, InconsistentIndex
from tessera.stream import StreamingDataset

runner = CliRunner()


def rewrite_index(folder: Path, edit) -> Path:
    index = read_json(folder / "index.json")
    edit(index["shards"])
    (folder / "index.json").write_text(json.dumps(index, sort_keys=True))
    return folder / "index.json"


def refused_everywhere(folder: Path, pattern: str) -> None:
    """MDSDataset, StreamingDataset and the index parser all refuse, with the same message."""
    with pytest.raises(InconsistentIndex, match=pattern):
        DatasetIndex.from_json((folder / "index.json").read_bytes(), str(folder / "index.json"))
    with pytest.raises(InconsistentIndex, match=pattern):
        MDSDataset(folder, cache_dir=folder.parent / "cache")
    with pytest.raises(ValueError, match=pattern):
        StreamingDataset(local=str(folder), batch_size=4)


def verify_lines(folder: Path) -> list[str]:
    res = runner.invoke(app, ["data", "verify", str(folder)])
    assert res.exit_code == 1, res.output
    return [line for line in res.output.splitlines() if line.startswith("problem:")]


def test_a_shard_listed_twice_is_refused_and_reported(make_dataset) -> None:
    folder = make_dataset(60, size_limit=1200)
    index = rewrite_index(folder, lambda shards: shards.append(dict(shards[1])))
    last = len(read_json(index)["shards"]) - 1
    pattern = rf"index.json \(shard {last}\): 'shard.00001.mds' is listed again \(first by shard 1\)"
    refused_everywhere(folder, pattern)
    res = runner.invoke(app, ["data", "verify", str(folder)])  # refused at the index, as every reader does
    assert res.exit_code == 1, res.output
    assert [line for line in res.output.splitlines() if line.strip()] == [
        f"error: {index} (shard {last}): 'shard.00001.mds' is listed again (first by shard 1): its samples "
        "would be read twice; remove the duplicate entry"]


def test_samples_zero_on_a_shard_with_samples_is_refused_and_reported(make_dataset) -> None:
    folder = make_dataset(60, size_limit=1200)
    entries = read_json(folder / "index.json")["shards"]

    def hide(shards: list[dict]) -> None:
        shards[2]["samples"] = 0

    rewrite_index(folder, hide)
    size = entries[2]["raw_data"]["bytes"]
    refused_everywhere(folder, rf"\(shard 2\): samples is 0 but 'shard.00002.mds' has {size} bytes \(an empty "
                               r"shard has \d+\)")
    lines = verify_lines(folder)
    assert any("samples is 0 but 'shard.00002.mds'" in line for line in lines)
    assert any(f"holds {entries[2]['samples']} samples but index.json records 0" in line for line in lines)


@pytest.mark.parametrize("writer", ["mosaic", "tessera"])
def test_a_real_empty_shard_still_reads(tmp_path: Path, writer: str) -> None:
    out = tmp_path / writer
    samples = [{"b": b"x" * 500, "n": 1}, {"b": b"y", "n": 2}, {"b": b"z", "n": 3}]
    make = MDSWriter(out=str(out), columns={"b": "bytes", "n": "int"}, size_limit=100) if writer == "mosaic" \
        else ShardWriter(out, {"b": "bytes", "n": "int"}, size_limit=100)
    with make as w:
        for sample in samples:
            w.write(sample)
    assert read_json(out / "index.json")["shards"][0]["samples"] == 0  # the quirk this test is about
    assert [int(s["n"]) for s in MDSDataset(out, cache_dir=tmp_path / "c")] == [1, 2, 3]
    assert sorted(int(s["n"]) for s in StreamingDataset(local=str(out), batch_size=1, shuffle=False)) == [1, 2, 3]
    assert runner.invoke(app, ["data", "verify", str(out)]).exit_code == 0


@pytest.fixture(scope="module")
def real_entries(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("entries") / "ds"
    with ShardWriter(out, {"n": "int"}, size_limit=200) as w:
        for i in range(200):
            w.write({"n": i})
    return read_json(out / "index.json")["shards"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_refused_exactly_when_a_file_is_named_twice(real_entries: list[dict], data: st.DataObject) -> None:
    """Any list of real entries (repeats allowed, names spelled with a './' prefix or not) loads exactly
    when no stored file is named twice, and then round-trips."""
    picks = data.draw(st.lists(st.integers(0, len(real_entries) - 1), max_size=8))
    dotted = data.draw(st.lists(st.booleans(), min_size=len(picks), max_size=len(picks)))
    shards = []
    for pick, dot in zip(picks, dotted, strict=True):
        entry = json.loads(json.dumps(real_entries[pick]))
        entry["raw_data"]["basename"] = ("./" if dot else "") + entry["raw_data"]["basename"]
        shards.append(entry)
    text = json.dumps({"shards": shards, "version": 2})
    if len(set(picks)) < len(picks):
        first = picks.index(next(p for i, p in enumerate(picks) if p in picks[:i]))
        with pytest.raises(InconsistentIndex, match=rf"is listed again \(first by shard {first}\)"):
            DatasetIndex.from_json(text, "index.json")
    else:
        index = DatasetIndex.from_json(text, "index.json")
        assert [e.raw_data.basename for e in index.shards] == [s["raw_data"]["basename"] for s in shards]
