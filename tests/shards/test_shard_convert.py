"""Converters and the `tessera data` commands: every input format, determinism across workers, the CLI."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import MDSDataset
from tessera.shards import sources as src
from tessera.shards.convert import convert, write_samples
from tessera.shards.sources import SourceError, parse_columns

runner = CliRunner()


def _jsonl(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"doc {i} " * (i % 7 + 1), "label": i % 5, "score": i / 4}) + "\n")
    return path


def _files_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_jsonl_round_trip_and_inferred_columns(tmp_path: Path) -> None:
    summary = convert(_jsonl(tmp_path / "a.jsonl", 300), tmp_path / "out", size_limit="4kb")
    assert summary.columns == {"text": "str", "label": "int", "score": "float64"}
    ds = MDSDataset(tmp_path / "out")
    assert len(ds) == 300 and summary.shards > 1
    assert ds[123]["text"] == "doc 123 " * (123 % 7 + 1) and ds[123]["label"] == 3
    assert float(ds[8]["score"]) == 2.0


def test_same_dataset_whatever_the_worker_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(src, "LINE_CHUNK", 2048)  # many chunks from a small file
    inp = _jsonl(tmp_path / "a.jsonl", 2000)
    convert(inp, tmp_path / "w1", size_limit="8kb", compression="zstd", hashes=["xxh64"], workers=1)
    convert(inp, tmp_path / "w2", size_limit="8kb", compression="zstd", hashes=["xxh64"], workers=2)
    assert len(src.plan_chunks(inp, "jsonl")) > 5
    one, two = _files_bytes(tmp_path / "w1"), _files_bytes(tmp_path / "w2")
    assert one == two
    assert [s["label"] for s in MDSDataset(tmp_path / "w2")] == [i % 5 for i in range(2000)]


def test_parquet_csv_tsv(tmp_path: Path) -> None:
    table = pa.table({"name": [f"n{i}" for i in range(50)], "value": list(range(50))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=7)
    convert(tmp_path / "t.parquet", tmp_path / "pq")
    assert [r["value"] for r in MDSDataset(tmp_path / "pq")] == list(range(50))
    (tmp_path / "c.csv").write_text("a,b\n1,x\n2,\"y,z\"\n")
    convert(tmp_path / "c.csv", tmp_path / "csv")
    assert [dict(r) for r in MDSDataset(tmp_path / "csv")] == [{"a": "1", "b": "x"}, {"a": "2", "b": "y,z"}]
    (tmp_path / "t.tsv").write_text("a\tb\n1\tq\n")
    convert(tmp_path / "t.tsv", tmp_path / "tsv", columns={"a": "str_int", "b": "str"})
    assert MDSDataset(tmp_path / "tsv")[0] == {"a": 1, "b": "q"}


def test_text_per_file_and_per_line(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("first\nfile")
    (docs / "sub" / "b.txt").write_text("second")
    convert(docs, tmp_path / "per_file", fmt="text")
    assert [r["text"] for r in MDSDataset(tmp_path / "per_file")] == ["first\nfile", "second"]
    convert(docs / "a.txt", tmp_path / "per_line", fmt="lines")
    assert [r["text"] for r in MDSDataset(tmp_path / "per_line")] == ["first", "file"]


def test_image_folder_keeps_jpeg_bytes(tmp_path: Path) -> None:
    originals = {}
    for label, cls in enumerate(["cat", "dog"]):
        (tmp_path / "img" / cls).mkdir(parents=True)
        for i in range(3):
            buf = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), 40 * i + label, np.uint8)).save(buf, format="JPEG")
            (tmp_path / "img" / cls / f"{i}.jpg").write_bytes(buf.getvalue())
            originals[(label, i)] = buf.getvalue()
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "img" / cls / "z.png")
    summary = convert(tmp_path / "img", tmp_path / "out")
    assert summary.format == "images" and summary.columns == {"image": "jpeg", "label": "int"}
    ds = MDSDataset(tmp_path / "out", columns=["label"])
    assert [r["label"] for r in ds] == [0, 0, 0, 0, 1, 1, 1, 1]
    raw = MDSDataset(tmp_path / "out").reader(0).raw_sample(0)
    assert originals[(0, 0)] in raw  # the original file's bytes, not a re-encoding
    assert MDSDataset(tmp_path / "out")[3]["image"].size == (4, 4)


def test_python_iterables(tmp_path: Path) -> None:
    n = write_samples(({"x": np.arange(4, dtype=np.int32) + i} for i in range(10)), tmp_path / "it",
                      {"x": "ndarray:int32:4"})
    assert n == 10 and MDSDataset(tmp_path / "it")[9]["x"].tolist() == [9, 10, 11, 12]


def test_bad_input_is_named(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(SourceError, match="bad.jsonl"):
        convert(tmp_path / "bad.jsonl", tmp_path / "o1")
    with pytest.raises(SourceError, match="missing"):
        convert(tmp_path / "missing", tmp_path / "o2")
    with pytest.raises(SourceError, match="NAME:ENCODING"):
        parse_columns("text")
    assert parse_columns("tokens:ndarray:uint16:2,3,label:int") == {"tokens": "ndarray:uint16:2,3", "label": "int"}


def test_cli_convert_inspect_head_verify_repair(tmp_path: Path) -> None:
    inp, out = _jsonl(tmp_path / "a.jsonl", 200), str(tmp_path / "out")
    res = runner.invoke(app, ["data", "convert", str(inp), out, "--columns", "text:str,label:int",
                              "--compression", "zstd", "--hashes", "xxh64,sha1", "--size-limit", "2kb"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["data", "inspect", out, "--json"])
    info = json.loads(res.stdout)
    assert info["samples"] == 200 and info["columns"] == {"label": "int", "text": "str"}
    assert info["compression"] == ["zstd"] and info["compression_ratio"] > 1
    res = runner.invoke(app, ["data", "head", out, "-n", "2"])
    assert [json.loads(line)["label"] for line in res.stdout.splitlines()] == [0, 1]
    assert runner.invoke(app, ["data", "verify", out]).exit_code == 0
    # corrupt one shard and delete another: verify lists both and exits non-zero
    shards = sorted((tmp_path / "out").glob("shard.*.mds.zstd"))
    data = bytearray(shards[1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    shards[1].write_bytes(bytes(data))
    shards[2].unlink()
    res = runner.invoke(app, ["data", "verify", out])
    assert res.exit_code == 1
    assert "shard 1" in res.output and "shard 2" in res.output
    # repair rebuilds a lost index from intact shards
    (tmp_path / "out" / "index.json").unlink()
    res = runner.invoke(app, ["data", "repair", out, "--skip-bad"])
    assert res.exit_code == 0, res.output
    assert 0 < len(MDSDataset(out)) < 200


@pytest.mark.s3
def test_cli_on_s3(tmp_path: Path, s3_bucket: str) -> None:
    url = f"{s3_bucket}/data"
    inp = _jsonl(tmp_path / "a.jsonl", 100)
    assert runner.invoke(app, ["data", "convert", str(inp), url, "--size-limit", "2kb"]).exit_code == 0
    res = runner.invoke(app, ["data", "inspect", url, "--json"])
    assert json.loads(res.stdout)["samples"] == 100
    assert runner.invoke(app, ["data", "verify", url]).exit_code == 0
    res = runner.invoke(app, ["data", "convert", str(inp), url])
    assert res.exit_code == 1 and "--mode overwrite" in res.output  # no silent overwrite
