"""MosaicML's JSON, CSV, TSV and XSV shard formats: Tessera's writers produce Mosaic's bytes (every file,
index.json included), `get_config()` is Mosaic's, Tessera streams Mosaic-written text datasets (local,
compressed, through DataLoader workers, from S3) and Mosaic reads Tessera-written ones; bad input and
damaged files are errors naming the file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import anchors  # (registers the torchvision stand-in, then imports streaming)
import pytest
import streaming
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import MDSDataset
from tessera.shards.errors import (
    ColumnMismatch,
    CorruptShard,
    EncodeError,
    EncodeTypeError,
    HashMismatch,
    UnknownEncoding,
)
from tessera.shards.text_writer import CSVWriter, JSONWriter, TSVWriter, XSVWriter
from tessera.shards.verify import verify_dataset
from tessera.shards.writer import MDSWriter
from tessera.stream import StreamingDataLoader, StreamingDataset

COLUMNS = {"id": "int", "text": "str", "score": "float"}
PAIRS = {"json": (JSONWriter, streaming.JSONWriter, {}), "csv": (CSVWriter, streaming.CSVWriter, {}),
         "tsv": (TSVWriter, streaming.TSVWriter, {}), "xsv": (XSVWriter, streaming.XSVWriter, {"separator": "|"})}


def sample(i: int) -> dict[str, Any]:
    # The first sample is larger than the size limit: Mosaic then writes an empty shard before it.
    return {"id": i - 3, "text": "long " * 150 if i == 0 else f"row é {i}", "score": i / 7}


def write(writer: Any, folder: Path, n: int = 60, **kwargs: Any) -> Path:
    with writer(out=str(folder), columns=COLUMNS, **kwargs) as out:
        for i in range(n):
            out.write(sample(i))
    return folder


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fmt", list(PAIRS))
@pytest.mark.parametrize("compression", [None, "zstd:7", "br", "bz2", "snappy"])
def test_writers_produce_mosaics_bytes(tmp_path: Path, fmt: str, compression: str | None) -> None:
    ours, theirs, extra = PAIRS[fmt]
    kwargs = {"compression": compression, "hashes": ["sha1", "xxh64"], "size_limit": 500, **extra}
    a = write(ours, tmp_path / "ours", **kwargs)
    b = write(theirs, tmp_path / "theirs", **kwargs)
    assert files(a) == files(b)
    index = json.loads((a / "index.json").read_text())
    assert [s["samples"] for s in index["shards"]][0] == 0 and sum(s["samples"] for s in index["shards"]) == 60
    assert {s["format"] for s in index["shards"]} == {fmt}


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_gzip_shards_hold_mosaics_bytes(tmp_path: Path, fmt: str) -> None:
    """gzip's header holds the time of writing, so the stored files differ; what they hold does not."""
    ours, theirs, extra = PAIRS[fmt]
    a = files(write(ours, tmp_path / "ours", compression="gz", size_limit=500, **extra))
    b = files(write(theirs, tmp_path / "theirs", compression="gz", size_limit=500, **extra))
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith(".gz"):
            assert gzip.decompress(a[name]) == gzip.decompress(b[name]), name
    raw = [{k: s[k] for k in ("raw_data", "raw_meta", "samples")} for s in json.loads(a["index.json"])["shards"]]
    assert raw == [{k: s[k] for k in ("raw_data", "raw_meta", "samples")} for s in json.loads(b["index.json"])["shards"]]


def test_get_config_is_mosaics(tmp_path: Path) -> None:
    for name, (ours, theirs, extra) in PAIRS.items():
        for kwargs in ({}, {"compression": "zstd:5", "hashes": ["md5", "xxh64"], "size_limit": "1mb"},
                       {"size_limit": None, "newline": "\r\n"}):
            mine = ours(out=str(tmp_path / f"{name}-o"), columns=COLUMNS, **kwargs, **extra)
            assert mine.get_config() == theirs(out=str(tmp_path / f"{name}-t"), columns=COLUMNS, **kwargs,
                                               **extra).get_config()
            mine.abort()
    columns = {"tokens": "ndarray:uint16:8", "text": "str", "label": "int", "img": "jpeg"}
    for kwargs in ({}, {"compression": "br:4", "hashes": ["sha1"], "size_limit": 1 << 20}, {"size_limit": 0}):
        mine = MDSWriter(out=str(tmp_path / "m-o"), columns=columns, **kwargs)
        theirs = anchors.MDSWriter(out=str(tmp_path / "m-t"), columns=columns, **kwargs)
        assert mine.get_config() == theirs.get_config()
        assert json.dumps(mine.get_config(), sort_keys=True).encode() == theirs.config_data
        mine.abort()


def test_mdswriter_takes_mosaics_arguments(tmp_path: Path) -> None:
    kwargs = {"columns": {"x": "int"}, "compression": "zstd", "size_limit": 256}
    with MDSWriter(out=str(tmp_path / "ours"), progress_bar=False, max_workers=2, **kwargs) as out:
        for i in range(100):
            out.write({"x": i})
    with anchors.MDSWriter(out=str(tmp_path / "theirs"), **kwargs) as out:
        for i in range(100):
            out.write({"x": i})
    assert files(tmp_path / "ours") == files(tmp_path / "theirs")
    with MDSWriter(out=str(tmp_path / "ours"), columns={"x": "int"}, exist_ok=True) as out:  # replaces it
        out.write({"x": 7})
    assert [s["x"] for s in MDSDataset(tmp_path / "ours")] == [7]
    with pytest.raises(ValueError, match="invalid writer argument"):
        MDSWriter(out=str(tmp_path / "x"), columns={"x": "int"}, progress=True)


@pytest.mark.parametrize(("fmt", "compression"), [("csv", None), ("json", "zstd"), ("tsv", "bz2"), ("xsv", None)])
def test_streaming_dataset_streams_mosaic_written_text_shards(tmp_path: Path, fmt: str, compression: str | None) -> None:
    _, theirs, extra = PAIRS[fmt]
    folder = write(theirs, tmp_path / "ds", n=90, compression=compression, size_limit=400, hashes=["xxh64"], **extra)
    ds = StreamingDataset(remote=str(folder), local=str(tmp_path / "cache"), batch_size=8, shuffle=True,
                          validate_hash="xxh64")
    got = sorted((s for s in ds), key=lambda s: s["id"])
    assert got == [sample(i) for i in range(90)]  # each sample exactly once, values as written
    assert ds[5] == sample(5)
    if compression is None:  # a local-only dataset is read in place
        assert sorted(s["id"] for s in StreamingDataset(local=str(folder), batch_size=8)) == [i - 3 for i in range(90)]


def test_text_shards_through_dataloader_workers(tmp_path: Path) -> None:
    folder = write(streaming.CSVWriter, tmp_path / "ds", n=64, compression="zstd", size_limit=300)
    ds = StreamingDataset(remote=str(folder), local=str(tmp_path / "cache"), batch_size=8, shuffle=True)
    batches = list(StreamingDataLoader(ds, batch_size=8, num_workers=2))
    ids = sorted(i for b in batches for i in b["id"].tolist())
    assert ids == [i - 3 for i in range(64)] and all(len(b["text"]) == 8 for b in batches)


def test_mosaic_reads_tessera_written_text_shards(tmp_path: Path) -> None:
    for name, (ours, _, extra) in PAIRS.items():
        folder = write(ours, tmp_path / name, compression="zstd", size_limit=500, **extra)
        anchors.clean_stale_shared_memory()
        theirs = anchors.StreamingDataset(local=str(folder), remote=None, shuffle=False, batch_size=1)
        assert [theirs[i] for i in range(theirs.num_samples)] == [sample(i) for i in range(60)], name


def test_text_shards_from_s3(tmp_path: Path, s3_bucket: str) -> None:
    url = f"{s3_bucket}/tsv"
    write(TSVWriter, url, n=50, compression="zstd", size_limit=300, hashes=["sha1"])  # type: ignore[arg-type]
    ds = StreamingDataset(remote=url, local=str(tmp_path / "cache"), batch_size=5, shuffle=True, validate_hash="sha1")
    assert sorted((s for s in ds), key=lambda s: s["id"]) == [sample(i) for i in range(50)]
    assert verify_dataset(url).ok


def test_bad_values_are_refused_naming_the_column(tmp_path: Path) -> None:
    with CSVWriter(out=str(tmp_path / "a"), columns=COLUMNS) as out:
        with pytest.raises(EncodeTypeError, match="'score'"):
            out.write({"id": 1, "text": "x", "score": 1})  # an int where float is declared, as Mosaic refuses
        with pytest.raises(ColumnMismatch, match="'text'"):
            out.write({"id": 1, "score": 1.0})
        with pytest.raises(EncodeError, match="separator"):
            out.write({"id": 1, "text": "a,b", "score": 1.0})
        out.write({"id": 1, "text": "ok", "score": 1.0})
    with pytest.raises(UnknownEncoding, match="'blob'"):
        JSONWriter(out=str(tmp_path / "b"), columns={"blob": "bytes"})
    with pytest.raises(ValueError, match="separator"):
        XSVWriter(out=str(tmp_path / "c"), columns={"a|b": "str"}, separator="|")
    assert [s["text"] for s in MDSDataset(tmp_path / "a")] == ["ok"]


def test_damaged_meta_files_are_errors_not_wrong_samples(tmp_path: Path) -> None:
    folder = write(streaming.JSONWriter, tmp_path / "ds", n=30, size_limit=300, hashes=["xxh64"])
    meta = folder / "shard.00001.json.meta"
    data = bytearray(meta.read_bytes())
    data[8] ^= 1  # the second sample's start offset
    meta.write_bytes(bytes(data))
    with pytest.raises(HashMismatch, match="shard.00001.json.meta"):
        list(StreamingDataset(remote=str(folder), local=str(tmp_path / "c1"), batch_size=4, validate_hash="xxh64"))
    with pytest.raises(CorruptShard, match="shard 1"):
        [s for s in StreamingDataset(remote=str(folder), local=str(tmp_path / "c2"), batch_size=4)]
    report = verify_dataset(folder)
    assert not report.ok and any("shard.00001.json.meta" in p for p in report.problems)


def test_meta_config_must_match_the_index(tmp_path: Path) -> None:
    folder = write(streaming.CSVWriter, tmp_path / "ds", n=10)
    meta = folder / "shard.00000.csv.meta"
    meta.write_bytes(meta.read_bytes().replace(b'"score"', b'"scorf"'))
    index = json.loads((folder / "index.json").read_text())
    index["shards"][0]["raw_meta"]["bytes"] = meta.stat().st_size
    (folder / "index.json").write_text(json.dumps(index, sort_keys=True))
    with pytest.raises(CorruptShard, match="other columns"):
        MDSDataset(folder)[0]


def test_inspect_and_verify_commands_on_text_datasets(tmp_path: Path) -> None:
    folder = write(CSVWriter, tmp_path / "ds", n=40, compression="zstd", size_limit=400, hashes=["sha1"])
    runner = CliRunner()
    res = runner.invoke(app, ["data", "inspect", str(folder), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["samples"] == 40 and info["formats"] == {"csv": info["shards"]}
    res = runner.invoke(app, ["data", "verify", str(folder)])
    assert res.exit_code == 0, res.output
