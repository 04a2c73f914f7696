"""`merge_index` as MosaicML's: the same index.json bytes as Mosaic's own merge for the same parts (both
call forms), datasets that Tessera's and Mosaic's StreamingDataset read whole, the CLI command, S3, and
refusals (a basename listed twice, a missing part) that leave the previous index as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anchors  # (registers the torchvision stand-in, then imports streaming)
import pytest
from streaming.base.util import merge_index as mosaic_merge_index
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import MDSDataset, ShardWriter
from tessera.shards.errors import DatasetNotFound, IndexFormatError
from tessera.shards.merge import merge_index
from tessera.shards.text_writer import CSVWriter
from tessera.stream import StreamingDataset

PARTS = ["part-1", "part0", "part1"]  # "part-1" sorts before "part0/" ('-' < '/'), as Mosaic lists them


def write_parts(root: Path | str, compression: str | None = "zstd") -> list[int]:
    """Three parts of 25 samples each (ids 0..74); returns the ids in part (key) order."""
    for p, name in enumerate(PARTS):
        with ShardWriter(f"{root}/{name}", {"id": "int", "part": "str"}, size_limit=300,
                         compression=compression, hashes=["xxh64"]) as writer:
            for i in range(25):
                writer.write({"id": p * 25 + i, "part": name})
    return list(range(75))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_same_bytes_as_mosaics_merge_of_a_root(tmp_path: Path, compression: str | None) -> None:
    write_parts(tmp_path / "ours", compression)
    shutil.copytree(tmp_path / "ours", tmp_path / "theirs")
    merged = merge_index(str(tmp_path / "ours"))
    mosaic_merge_index(str(tmp_path / "theirs"))
    ours, theirs = (tmp_path / "ours/index.json").read_bytes(), (tmp_path / "theirs/index.json").read_bytes()
    assert ours == theirs
    assert merged.num_samples == 75 and merged.shards[0].raw_data.basename.startswith("part-1/shard.00000.mds")
    ds = MDSDataset(tmp_path / "ours")
    assert [s["id"] for s in ds] == [25 * PARTS.index(n) + i for n in sorted(PARTS) for i in range(25)]


def test_same_bytes_as_mosaics_merge_of_a_list(tmp_path: Path) -> None:
    write_parts(tmp_path / "ours")
    shutil.copytree(tmp_path / "ours", tmp_path / "theirs")
    order = ["part1", "part-1"]  # a chosen subset, in the caller's order
    merge_index([str(tmp_path / "ours" / p / "index.json") for p in order], str(tmp_path / "ours"))
    mosaic_merge_index([str(tmp_path / "theirs" / p / "index.json") for p in order], str(tmp_path / "theirs"))
    assert (tmp_path / "ours/index.json").read_bytes() == (tmp_path / "theirs/index.json").read_bytes()
    assert [s["part"] for s in MDSDataset(tmp_path / "ours")] == ["part1"] * 25 + ["part-1"] * 25


def test_streaming_datasets_read_the_merged_dataset(tmp_path: Path) -> None:
    ids = write_parts(tmp_path / "ds")
    merge_index(str(tmp_path / "ds"))
    ours = StreamingDataset(remote=str(tmp_path / "ds"), local=str(tmp_path / "cache"), batch_size=5, shuffle=True)
    assert sorted(s["id"] for s in ours) == ids
    anchors.clean_stale_shared_memory()
    theirs = anchors.StreamingDataset(remote=str(tmp_path / "ds"), local=str(tmp_path / "mcache"), batch_size=5,
                                      shuffle=False)
    assert sorted(int(theirs[i]["id"]) for i in range(theirs.num_samples)) == ids


def test_merges_text_shards_and_parts_outside_out(tmp_path: Path) -> None:
    for p in ("a", "b"):
        with CSVWriter(out=str(tmp_path / "parts" / p), columns={"id": "int"}, size_limit=20) as writer:
            for i in range(10):
                writer.write({"id": i})
    merge_index([str(tmp_path / "parts/a"), str(tmp_path / "parts/b/")], str(tmp_path / "parts"))
    index = json.loads((tmp_path / "parts/index.json").read_text())
    assert {s["raw_meta"]["basename"].split("/")[0] for s in index["shards"]} == {"a", "b"}
    assert [s["id"] for s in MDSDataset(tmp_path / "parts")] == list(range(10)) * 2


def test_refusals_leave_the_previous_index(tmp_path: Path) -> None:
    write_parts(tmp_path / "ds")
    merge_index(str(tmp_path / "ds"))
    before = (tmp_path / "ds/index.json").read_bytes()
    part = str(tmp_path / "ds/part0")
    with pytest.raises(IndexFormatError, match="listed twice"):
        merge_index([part, part + "/index.json"], str(tmp_path / "ds"))
    with pytest.raises(DatasetNotFound, match="nope"):
        merge_index([part, str(tmp_path / "ds/nope")], str(tmp_path / "ds"))
    with pytest.raises(DatasetNotFound, match="no part to merge"):
        merge_index(str(tmp_path / "ds/part0"))
    with pytest.raises(ValueError, match="invalid arguments"):
        merge_index()
    assert (tmp_path / "ds/index.json").read_bytes() == before


def test_merge_index_command(tmp_path: Path) -> None:
    ids = write_parts(tmp_path / "ds")
    runner = CliRunner()
    res = runner.invoke(app, ["data", "merge-index", str(tmp_path / "ds")])
    assert res.exit_code == 0, res.output
    assert "75 samples" in " ".join(res.output.split())
    assert sorted(s["id"] for s in MDSDataset(tmp_path / "ds")) == ids
    res = runner.invoke(app, ["data", "merge-index", str(tmp_path / "ds"), str(tmp_path / "ds/part0"),
                              str(tmp_path / "ds/part0")])
    assert res.exit_code == 0 and len(MDSDataset(tmp_path / "ds")) == 25  # duplicates dropped, as Mosaic does
    res = runner.invoke(app, ["data", "merge-index", str(tmp_path / "missing")])
    text = " ".join(res.output.split())  # the console may wrap long lines
    assert res.exit_code == 1 and "missing: no part to merge" in text and "Traceback" not in text


def test_merge_on_s3(tmp_path: Path, s3_bucket: str) -> None:
    url = f"{s3_bucket}/ds"
    ids = write_parts(url)
    write_parts(tmp_path / "local")
    merge_index(url)
    merge_index(str(tmp_path / "local"))
    from tessera.storage import open_store

    remote = open_store(url).get("index.json")
    assert remote == (tmp_path / "local/index.json").read_bytes()  # the same bytes as a local merge
    ds = StreamingDataset(remote=url, local=str(tmp_path / "cache"), batch_size=5, validate_hash="xxh64")
    assert sorted(s["id"] for s in ds) == ids
