"""`convert` from a bucket (SeaweedFS here): every input format, one object or a prefix, gives byte for
byte the dataset that the same input converts to from a local folder; errors name the object's URL."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import sources as src
from tessera.shards.convert import convert
from tessera.shards.sources import SourceError
from tessera.storage import open_store

runner = CliRunner()


def files_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def upload(local: Path, url: str) -> str:
    """Copy a local file or folder to `url` (key for key), as a user's corpus in a bucket would be."""
    store = open_store(url.rsplit("/", 1)[0] if local.is_file() else url)
    for rel, data in ({local.name: local.read_bytes()} if local.is_file() else files_bytes(local)).items():
        store.put(rel, data)
    return url


def image(color: tuple[int, int, int], fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), color).save(buf, format=fmt)
    return buf.getvalue()


def write_inputs(root: Path) -> dict[str, tuple[Path, dict]]:
    """One input per format: (local path, convert options)."""
    jsonl = root / "jsonl"
    (jsonl / "part").mkdir(parents=True)
    for name, n in (("a.jsonl", 120), ("part/b.jsonl", 40)):
        with open(jsonl / name, "w") as f:
            for i in range(n):
                f.write(json.dumps({"text": f"{name} doc {i} " * (i % 5 + 1), "label": i % 3}) + "\n")
    (jsonl / ".hidden.jsonl").write_text('{"text": "not input", "label": 0}\n')
    table = pa.table({"text": [f"row {i}" for i in range(90)], "n": list(range(90))})
    pq.write_table(table, root / "t.parquet", row_group_size=25)
    (root / "t.csv").write_text('text,n\n"a, quoted\ncell",1\nplain,2\n' + "".join(f"r{i},{i}\n" for i in range(50)))
    (root / "t.tsv").write_text("text\tn\n" + "".join(f"t{i}\t{i}\n" for i in range(50)))
    text = root / "text"
    (text / "sub").mkdir(parents=True)
    (text / "one.txt").write_bytes(b"first line\r\nsecond line\r\n")  # universal newlines, as locally
    (text / "sub" / "two.txt").write_text("naive cafe \u2713\n")
    images = root / "images"
    for cls, color in (("cat", (200, 10, 10)), ("dog", (10, 10, 200))):
        (images / cls).mkdir(parents=True)
        (images / cls / "x.png").write_bytes(image(color, "PNG"))
        (images / cls / "y.jpg").write_bytes(image(color, "JPEG"))
    return {"jsonl": (jsonl, {}), "jsonl_file": (jsonl / "a.jsonl", {}), "parquet": (root / "t.parquet", {}),
            "csv": (root / "t.csv", {}), "tsv": (root / "t.tsv", {}), "text": (text, {}),
            "lines": (jsonl / "a.jsonl", {"fmt": "lines"}), "images": (images, {})}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    return write_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.mark.parametrize("name", ["jsonl", "jsonl_file", "parquet", "csv", "tsv", "text", "lines", "images"])
def test_bucket_input_converts_byte_for_byte_like_the_local_one(name: str, inputs, s3_bucket: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(src, "LINE_CHUNK", 1500)  # several line chunks per JSONL file
    local, options = inputs[name]
    url = upload(local, f"{s3_bucket}/in/{local.name}")
    want = convert(local, tmp_path / "local", size_limit="2kb", compression="zstd", **options)
    got = convert(url, tmp_path / "remote", size_limit="2kb", compression="zstd", **options)
    assert (got.format, got.columns, got.samples) == (want.format, want.columns, want.samples)
    assert files_bytes(tmp_path / "remote") == files_bytes(tmp_path / "local")
    assert want.samples > 0


def test_bucket_prefix_to_bucket_with_workers(inputs, s3_bucket: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Two worker processes read the bucket (spawned: the parent has used the object store) while the
    parent writes to the bucket; the dataset equals the local one-worker conversion."""
    monkeypatch.setattr(src, "LINE_CHUNK", 1500)
    local, _ = inputs["jsonl"]
    url = upload(local, f"{s3_bucket}/corpus")
    convert(local, tmp_path / "local", size_limit="2kb")
    res = runner.invoke(app, ["data", "convert", url + "/", f"{s3_bucket}/out", "--size-limit", "2kb",
                              "--workers", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = open_store(f"{s3_bucket}/out")
    assert {info.key: out.get(info.key) for info in out.list()} == files_bytes(tmp_path / "local")


def test_bucket_input_errors_name_the_object(s3_bucket: str, tmp_path: Path) -> None:
    store = open_store(f"{s3_bucket}/bad")
    store.put("a.jsonl", b'{"text": "ok"}\n{"text": "ok"}\n{"text": broken}\n')
    with pytest.raises(SourceError, match=rf"{s3_bucket}/bad/a.jsonl, line 3: bad JSON"):
        convert(f"{s3_bucket}/bad/a.jsonl", tmp_path / "out1")
    with pytest.raises(SourceError, match=rf"{s3_bucket}/missing: no such object, and no objects under it"):
        convert(f"{s3_bucket}/missing", tmp_path / "out2")
    res = runner.invoke(app, ["data", "convert", f"{s3_bucket}/missing", str(tmp_path / "out3")])
    said = " ".join(res.output.split())  # (rich wraps long lines)
    assert res.exit_code == 1 and f"{s3_bucket}/missing: no such object" in said and "Traceback" not in said
