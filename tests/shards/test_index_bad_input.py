"""index.json values that used to end in a MemoryError, an IsADirectoryError or a hang are refused when the
index is read, in one line naming the index file, the shard and the value, by every reader alike: a
StreamingDataset being built, `tessera data inspect` and `tessera data verify` (exit 1).

- `samples` beyond what the shard's bytes can hold (a u32 offset per sample in the MDS file, or in a text
  shard's meta file), or past 2**31-1: refused before a reader sizes anything by it;
- a basename naming a folder ('.', './', 'sub/') or leaving the root ('..', absolute), or empty;
- 50,000 entries repeating one shard: refused at the second entry, before the rest are even parsed.
Datasets MosaicML's own writers produce, as dense as they come, still load (the bound is the format's).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from shard_helpers import read_json
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import IndexFormatError, ShardWriter
from tessera.shards.index import DatasetIndex
from tessera.stream import StreamingDataset

runner = CliRunner()
pytestmark = pytest.mark.timeout(60)  # a refusal comes at once; a hang (50,000 shards checked) fails here


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 small samples in 7 MDS shards (the first holds 6 in 299 bytes)."""
    out = tmp_path_factory.mktemp("bad-index") / "ds"
    with ShardWriter(out, {"id": "int", "text": "str"}, size_limit=300) as writer:
        for i in range(40):
            writer.write({"id": i, "text": "x" * i})
    return out


def damaged(dataset: Path, tmp_path: Path, edit) -> Path:
    """A copy of the dataset's index.json, edited (the shard files are shared: nothing reads them)."""
    folder = tmp_path / "ds"
    folder.mkdir()
    index = read_json(dataset / "index.json")
    edit(index)
    (folder / "index.json").write_text(json.dumps(index, sort_keys=True))
    return folder


def refused_everywhere(folder: Path, detail: str, shard: int = 0) -> None:
    """StreamingDataset, inspect and verify all stop at the index with the same one line."""
    message = f"{folder / 'index.json'} (shard {shard}): {detail}"
    with pytest.raises(IndexFormatError, match=f"^{re.escape(message)}$"):
        StreamingDataset(remote=str(folder), local=str(folder.parent / "cache"), batch_size=2)
    for command in ("inspect", "verify"):
        done = runner.invoke(app, ["data", command, str(folder)])
        assert done.exit_code == 1, done.output
        assert [line for line in done.output.splitlines() if line.strip()] == [f"error: {message}"], command


def test_samples_past_the_per_shard_limit(dataset: Path, tmp_path: Path) -> None:
    folder = damaged(dataset, tmp_path, lambda index: index["shards"][0].update(samples=2**31))
    refused_everywhere(folder, "samples must be an integer from 0 to 2147483647, got 2147483648")


def test_samples_more_than_the_shard_bytes_hold(dataset: Path, tmp_path: Path) -> None:
    assert read_json(dataset / "index.json")["shards"][0]["raw_data"]["bytes"] == 299
    folder = damaged(dataset, tmp_path, lambda index: index["shards"][0].update(samples=73))
    refused_everywhere(folder, "samples is 73, but 'shard.00000.mds' of 299 bytes holds at most 72 (4 bytes of "
                               "offset each): the count or the size in index.json is wrong")


@pytest.mark.parametrize(("basename", "why"), [
    (".", "names a folder, not a shard file"),
    ("./", "names a folder, not a shard file"),
    ("sub/", "names a folder, not a shard file"),
    ("", "is not a non-empty string"),
    ("..", "is absolute or climbs out of the dataset root (refused)"),
    ("../ds/shard.00000.mds", "is absolute or climbs out of the dataset root (refused)"),
    ("/etc/passwd", "is absolute or climbs out of the dataset root (refused)"),
])
def test_basenames_that_are_no_shard_file_in_the_root(dataset: Path, tmp_path: Path, basename: str,
                                                      why: str) -> None:
    folder = damaged(dataset, tmp_path, lambda index: index["shards"][3]["raw_data"].update(basename=basename))
    refused_everywhere(folder, f"shard basename {basename!r} {why}", shard=3)


def test_fifty_thousand_duplicate_entries_fail_at_the_first(dataset: Path, tmp_path: Path) -> None:
    """The last entry is malformed: had the entries all been parsed before the duplicate check, that
    would be the error; the duplicate's shows the refusal came at entry 1."""

    def repeat(index: dict) -> None:
        index["shards"] = [index["shards"][0]] * 49_999 + [{"format": "bogus"}]

    folder = damaged(dataset, tmp_path, repeat)
    refused_everywhere(folder, "'shard.00000.mds' is listed again (first by shard 0): its samples would be "
                               "read twice; remove the duplicate entry", shard=1)


@pytest.mark.parametrize("fmt", ["mds", "json", "csv"])
def test_mosaics_densest_shards_load_and_the_bound_is_exact(tmp_path: Path, fmt: str) -> None:
    """MosaicML's writers at one tiny sample a shard-byte or so: every entry loads; the count one past the
    bound (the offsets file's (bytes - 8) // 4) is refused, the bound itself is not."""
    from anchors import streaming  # here: importing MosaicML's package takes seconds

    writer = {"mds": streaming.MDSWriter, "json": streaming.JSONWriter, "csv": streaming.CSVWriter}[fmt]
    columns = {"n": "uint8"} if fmt == "mds" else {"n": "int"}
    with writer(out=str(tmp_path / "ds"), columns=columns, size_limit=2000) as out:
        for i in range(1500):
            out.write({"n": i % 10})
    text = (tmp_path / "ds" / "index.json").read_text()
    index = DatasetIndex.from_json(text, "index.json")
    assert len(index.shards) > 1 and index.num_samples == 1500
    shards = json.loads(text)["shards"]
    offsets = shards[0]["raw_data" if fmt == "mds" else "raw_meta"]
    bound = (offsets["bytes"] - 8) // 4
    assert shards[0]["samples"] <= bound
    for samples, ok in ((bound, True), (bound + 1, False)):
        shards[0]["samples"] = samples
        edited = json.dumps({"shards": shards, "version": 2})
        if ok:
            assert DatasetIndex.from_json(edited, "index.json").shards[0].samples == bound
        else:
            with pytest.raises(IndexFormatError, match=rf"samples is {bound + 1}, but .* holds at most {bound}"):
                DatasetIndex.from_json(edited, "index.json")
