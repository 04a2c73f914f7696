"""Parallel conversion: workers encode whole chunks, the parent cuts shards from their bytes.

What must hold whatever the worker count: the same shard files and index.json byte for byte, shards cut
exactly where one `ShardWriter.write` per sample cuts them, resume after an interruption, and errors that
name the input file and line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shard_helpers import without_provenance

from tessera.shards import MDSDataset, ShardWriter
from tessera.shards import convert as convert_module
from tessera.shards import sources as src
from tessera.shards.convert import convert, start_method
from tessera.shards.session import JOURNAL_BASENAME
from tessera.shards.sources import SourceError
from tessera.storage import open_store

COLUMNS = {"text": "str", "label": "int", "score": "float64"}


def _sample(i: int) -> dict:
    return {"text": f"doc {i} " * (i % 13 + 1), "label": i % 5, "score": i / 4}


def _jsonl(path: Path, n: int, bad: dict[int, str] | None = None) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write((bad or {}).get(i, json.dumps(_sample(i))) + "\n")
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(src, "LINE_CHUNK", 3000)  # many chunks from a small file; shards span chunk ends


def _handover_dirs() -> set[str]:
    root = Path(convert_module.HANDOVER_ROOT)
    return {p.name for p in root.glob("tessera-convert-*")} if root.is_dir() else set()


def test_byte_identical_for_1_2_3_workers_and_to_one_write_per_sample(tmp_path: Path, small_chunks: None) -> None:
    inp = _jsonl(tmp_path / "a.jsonl", 3000)
    opts = {"size_limit": "9kb", "compression": "zstd", "hashes": ["xxh64", "sha1"]}
    before = _handover_dirs()
    outs = {n: tmp_path / f"w{n}" for n in (1, 2, 3)}
    for n, out in outs.items():
        convert(inp, out, columns=COLUMNS, workers=n, **opts)
    with ShardWriter(tmp_path / "ref", COLUMNS, **opts) as writer:  # the reference cutting: one write per sample
        for i in range(3000):
            writer.write(_sample(i))
    assert len(src.plan_chunks(inp, "jsonl")) > 20
    ref = _files(tmp_path / "ref")
    assert len(ref) > 20
    for out in outs.values():
        assert without_provenance(_files(out)) == ref
    assert [r["label"] for r in MDSDataset(outs[3])] == [i % 5 for i in range(3000)]
    assert _handover_dirs() == before  # nothing left in /dev/shm


def test_handover_folders_of_killed_conversions_are_removed(tmp_path: Path, small_chunks: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversion killed with kill -9 leaves its tmpfs folder; the next one removes it (its process is
    gone) and leaves those of conversions still running."""
    root = tmp_path / "tmpfs"
    root.mkdir()
    monkeypatch.setattr(convert_module, "HANDOVER_ROOT", str(root))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    (root / f"tessera-convert-{dead}-abc").mkdir()
    (root / f"tessera-convert-{dead}-abc" / "chunk.0").write_bytes(b"x" * 1000)
    (root / f"tessera-convert-{os.getpid()}-live").mkdir()  # a conversion of a running process
    convert(_jsonl(tmp_path / "a.jsonl", 300), tmp_path / "out", columns=COLUMNS, size_limit="6kb", workers=2)
    assert sorted(p.name for p in root.iterdir()) == [f"tessera-convert-{os.getpid()}-live"]


def test_spawned_workers_and_no_tmpfs_give_the_same_bytes(tmp_path: Path, small_chunks: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    inp = _jsonl(tmp_path / "a.jsonl", 800)
    convert(inp, tmp_path / "w1", columns=COLUMNS, size_limit="6kb", compression="zstd", workers=1)
    monkeypatch.setattr(convert_module, "start_method", lambda: "spawn")
    monkeypatch.setattr(convert_module, "HANDOVER_ROOT", str(tmp_path / "no-such-tmpfs"))  # bodies via the pipe
    convert(inp, tmp_path / "w2", columns=COLUMNS, size_limit="6kb", compression="zstd", workers=2)
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2")


def test_start_method_forks_only_without_other_threads() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert start_method() == "spawn"
    finally:
        stop.set()
        thread.join()


def test_resume_continues_an_interrupted_conversion(tmp_path: Path, small_chunks: None) -> None:
    inp = _jsonl(tmp_path / "a.jsonl", 2000)
    opts = {"columns": COLUMNS, "size_limit": "8kb", "compression": "zstd"}
    convert(inp, tmp_path / "fresh", workers=2, **opts)
    with pytest.raises(RuntimeError):  # an interrupted write: some shards stored, no index
        with ShardWriter(tmp_path / "out", COLUMNS, size_limit="8kb", compression="zstd") as writer:
            writer.journal_interval = 0
            for i in range(1234):
                writer.write(_sample(i))
            raise RuntimeError("interrupted")
    assert (tmp_path / "out" / JOURNAL_BASENAME).exists() and not (tmp_path / "out" / "index.json").exists()
    summary = convert(inp, tmp_path / "out", workers=2, mode="resume", **opts)
    assert 0 < summary.skipped < 1234
    assert _files(tmp_path / "out") == _files(tmp_path / "fresh")


def test_bad_json_names_the_line_in_the_file(tmp_path: Path, small_chunks: None) -> None:
    inp = _jsonl(tmp_path / "bad.jsonl", 1500, bad={1400: '{"text": "x", "label": '})
    before = _handover_dirs()
    for workers in (1, 2):
        with pytest.raises(SourceError, match=r"bad\.jsonl, line 1401: bad JSON"):
            convert(inp, tmp_path / f"o{workers}", columns=COLUMNS, workers=workers)
        assert not (tmp_path / f"o{workers}" / "index.json").exists()
    assert _handover_dirs() == before


def test_bad_values_name_the_line_and_column(tmp_path: Path, small_chunks: None) -> None:
    bad = {1234: json.dumps({"text": "x", "label": "seven", "score": 1.0})}
    inp = _jsonl(tmp_path / "vals.jsonl", 1500, bad=bad)
    with pytest.raises(SourceError, match=r"vals\.jsonl, line 1235: column 'label' \(int\)"):
        convert(inp, tmp_path / "o", columns=COLUMNS, workers=2)
    missing = _jsonl(tmp_path / "miss.jsonl", 100, bad={7: json.dumps({"text": "x", "label": 1})})
    with pytest.raises(SourceError, match=r"miss\.jsonl, line 8: column 'score'.*missing"):
        convert(missing, tmp_path / "o2", columns=COLUMNS)


def test_bad_parquet_row_and_csv_cell_are_named(tmp_path: Path) -> None:
    values = [f"v{i}" for i in range(40)]
    values[33] = None  # a null in a str column
    pq.write_table(pa.table({"name": values}), tmp_path / "t.parquet", row_group_size=10)
    with pytest.raises(SourceError, match=r"t\.parquet, row 33 \(row group 3\): column 'name' \(str\)"):
        convert(tmp_path / "t.parquet", tmp_path / "pq", columns={"name": "str"}, workers=2)
    (tmp_path / "c.csv").write_text("a,b\n1,x\n2,\"multi\nline\"\nthree,z\n")
    with pytest.raises(SourceError, match=r"c\.csv, line 5: column 'a' \(int\): cannot parse 'three'"):
        convert(tmp_path / "c.csv", tmp_path / "csv", columns={"a": "int", "b": "str"})


def test_lines_and_text_errors_are_named(tmp_path: Path, small_chunks: None) -> None:
    data = b"".join(b"line %d\n" % i for i in range(1000)) + b"bad \xff byte\n"
    (tmp_path / "l.txt").write_bytes(data)
    with pytest.raises(SourceError, match=r"l\.txt, line 1001: not UTF-8"):
        convert(tmp_path / "l.txt", tmp_path / "o", fmt="lines", workers=2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 700), max_size=25), max_size=8), st.one_of(st.none(), st.integers(1, 4000)),
       st.lists(st.booleans(), max_size=8))
def test_write_encoded_cuts_where_write_does(batches: list[list[int]], limit: int | None, per_sample: list[bool]) -> None:
    """Batches of pre-encoded samples, mixed with single writes, give the files of one write per sample."""
    def sample(n: int, k: int) -> dict:
        return {"b": bytes([k % 251]) * n}

    ref, mixed = (f"memory://enc-{uuid.uuid4().hex[:10]}" for _ in range(2))
    k = 0
    with ShardWriter(ref, {"b": "bytes"}, size_limit=limit) as a, ShardWriter(mixed, {"b": "bytes"}, size_limit=limit) as b:
        for j, lengths in enumerate(batches):
            samples = [sample(n, k + i) for i, n in enumerate(lengths)]
            k += len(lengths)
            for s in samples:
                a.write(s)
            if j < len(per_sample) and per_sample[j]:
                for s in samples:
                    b.write(s)
            else:  # a bytes value is stored as a u32 size then its bytes
                parts = [np.uint32(len(s["b"])).tobytes() + s["b"] for s in samples]
                b.write_encoded(np.array([len(p) for p in parts], dtype=np.uint32), b"".join(parts))
    a_store, b_store = open_store(ref), open_store(mixed)
    assert a_store.get("index.json") == b_store.get("index.json")
    for entry in json.loads(a_store.get("index.json"))["shards"]:
        key = entry["raw_data"]["basename"]
        assert a_store.get(key) == b_store.get(key)


def test_write_encoded_checks_the_body_length(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "o", {"b": "bytes"}) as writer:
        with pytest.raises(ValueError, match="add up to 10 bytes, the body has 9"):
            writer.write_encoded([4, 6], b"x" * 9)
        writer.write_encoded([], b"")
    assert os.path.exists(tmp_path / "o" / "index.json")


@pytest.mark.parametrize("workers", [1, 2])
def test_uniform_parquet_rows_encode_like_one_write_per_row(tmp_path: Path, workers: int) -> None:
    """Row groups encoded with numpy (fixed-size rows) give the bytes of `ShardWriter.write` on each row,
    and row groups that cannot (nulls, varying lengths) fall back per row, in the same dataset."""
    n = 300
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 50_000, 16, dtype=np.uint16).tobytes() for _ in range(n)]
    table = pa.table({
        "tokens": pa.array(tokens, pa.binary()),
        "id": pa.array(range(n), pa.int64()),
        "score": pa.array(rng.random(n), pa.float32()),
        "tag": pa.array([f"t{i % 10}" for i in range(n)], pa.string()),  # 2 bytes each: uniform
        "blob": pa.array([b"ab"] * n, pa.large_binary()),
        "extra": pa.array([[i] for i in range(n)]),  # not a column of the dataset: ignored
    })
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=64)
    columns = {"tokens": "ndarray:uint16:16", "id": "int", "score": "float32", "tag": "str", "blob": "bytes"}
    rows = table.to_pylist()
    for name, cols in {"all": columns, "tokens": {"tokens": "ndarray:uint16:16"},
                       "ints": {"id": "int64", "score": "float32"}}.items():
        convert(tmp_path / "t.parquet", tmp_path / f"{name}{workers}", columns=cols, size_limit="3kb",
                compression="zstd", workers=workers)
        with ShardWriter(tmp_path / f"{name}-ref", cols, size_limit="3kb", compression="zstd") as writer:
            for row in rows:
                writer.write(row)
        assert without_provenance(_files(tmp_path / f"{name}{workers}")) == _files(tmp_path / f"{name}-ref")
    # varying lengths and a null: these row groups go per row (and the null is an error naming its row)
    ragged = pa.table({"tag": pa.array([f"t{i}" for i in range(n)], pa.string())})
    pq.write_table(ragged, tmp_path / "r.parquet", row_group_size=64)
    convert(tmp_path / "r.parquet", tmp_path / f"ragged{workers}", columns={"tag": "str"}, workers=workers)
    assert [r["tag"] for r in MDSDataset(tmp_path / f"ragged{workers}")] == [f"t{i}" for i in range(n)]
    # a uniform first row group (the parent then encodes in-line), ragged ones after it
    tags = ["aa"] * 64 + [f"t{i}" for i in range(64, n)]
    pq.write_table(pa.table({"tag": pa.array(tags, pa.string())}), tmp_path / "m.parquet", row_group_size=64)
    convert(tmp_path / "m.parquet", tmp_path / f"mixed{workers}", columns={"tag": "str"}, workers=workers)
    assert [r["tag"] for r in MDSDataset(tmp_path / f"mixed{workers}")] == tags


def test_cli_convert_with_workers(tmp_path: Path, small_chunks: None) -> None:
    from typer.testing import CliRunner

    from tessera.cli.main import app

    inp = _jsonl(tmp_path / "a.jsonl", 600)
    for n in (1, 2):
        res = CliRunner().invoke(app, ["data", "convert", str(inp), str(tmp_path / f"c{n}"), "--workers", str(n),
                                       "--compression", "zstd", "--size-limit", "4kb"])
        assert res.exit_code == 0, res.output
    assert _files(tmp_path / "c1") == _files(tmp_path / "c2")
