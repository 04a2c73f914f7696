"""Data prep: EOS placement, windows, the val split, dtypes, and identical output for any worker count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llm_helpers import write_jsonl_corpus, write_text_corpus

import tessera.shards.sources as sources
from tessera.llm.prep import is_validation, prep, token_dtype
from tessera.shards import MDSDataset
from tessera.shards.sources import SourceError


def split_tokens(url, split: str) -> np.ndarray:
    with MDSDataset(url, split=split) as ds:
        if len(ds) == 0:
            return np.zeros(0, np.uint16)
        return ds.get_batch(slice(0, len(ds)))["tokens"].reshape(-1)


def expected_stream(docs: list[str], val_fraction: float, split: str, seq_len: int) -> np.ndarray:
    """Byte tokenizer: each document's UTF-8 bytes then EOS (256), in order, cut to whole windows."""
    ids: list[int] = []
    for i, doc in enumerate(docs):
        if is_validation(i, val_fraction) == (split == "val"):
            ids += [*doc.encode("utf-8"), 256]
    return np.asarray(ids[:len(ids) // seq_len * seq_len], dtype=np.uint16)


def test_eos_after_every_document_and_exact_windows(prepped, text_corpus):
    docs = text_corpus[1]
    assert any(is_validation(i, 0.2) for i in range(len(docs)))
    for split in ("train", "val"):
        with MDSDataset(prepped, split=split) as ds:
            assert ds.index.shards[0].column_encodings == ["ndarray:uint16:32"]
        got = split_tokens(prepped, split)
        assert np.array_equal(got, expected_stream(docs, 0.2, split, 32))
    train = split_tokens(prepped, "train")
    assert (train == 256).sum() >= 10  # documents are separated by EOS, not glued together


def test_same_bytes_whatever_the_number_of_workers(tmp_path, monkeypatch, bpe_path):
    corpus = tmp_path / "docs.jsonl"
    write_jsonl_corpus(corpus, 120)
    monkeypatch.setattr(sources, "LINE_CHUNK", 1500)  # many chunks; they are planned in this process
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        summary = prep(corpus, out, bpe_path, seq_len=16, val_fraction=0.1, workers=workers, size_limit="2kb",
                       compression="zstd")
        outs.append(out)
    assert summary.documents == 120 and summary.windows["train"] > 20 and summary.windows["val"] > 0
    files = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*") if p.is_file())
    assert len([f for f in files if f.name.startswith("shard.")]) > 4
    assert files == sorted(p.relative_to(outs[1]) for p in outs[1].rglob("*") if p.is_file())
    for rel in files:
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel


def test_parquet_with_a_chosen_field(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    docs = [f"document number {i} " * (i % 5 + 1) for i in range(50)]
    pq.write_table(pa.table({"id": list(range(50)), "content": docs}), tmp_path / "d.parquet", row_group_size=10)
    summary = prep(tmp_path / "d.parquet", tmp_path / "out", "byte", seq_len=24, text_field="content",
                   val_fraction=0.0, workers=2)
    assert summary.documents == 50 and summary.documents_per_split["val"] == 0
    assert np.array_equal(split_tokens(tmp_path / "out", "train"), expected_stream(docs, 0.0, "train", 24))
    with pytest.raises(SourceError, match="no field 'text'"):
        prep(tmp_path / "d.parquet", tmp_path / "out2", "byte", seq_len=24)


def test_straight_to_a_bucket_url(tmp_path):
    docs = write_text_corpus(tmp_path / "docs", 12, seed=5)
    url = "memory://prep-test-bucket/data"
    summary = prep(tmp_path / "docs", url, "byte", seq_len=20, val_fraction=0.0)
    assert summary.windows["train"] == len(split_tokens(url, "train")) // 20 > 0
    assert np.array_equal(split_tokens(url, "train"), expected_stream(docs, 0.0, "train", 20))


def test_binary_files_are_skipped_and_suffixes_select(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.py").write_text("print('a')\n")
    (root / "b.md").write_text("# b\n")
    (root / "c.pyc").write_bytes(b"\x00\xff\xfe")
    summary = prep(root, tmp_path / "all", "byte", seq_len=4, val_fraction=0.0)
    assert summary.documents == 2 and summary.skipped_files == 1
    summary = prep(root, tmp_path / "py", "byte", seq_len=4, val_fraction=0.0, suffixes=[".py"])
    assert summary.documents == 1 and summary.tokens == len("print('a')\n") + 1


def test_token_dtype_and_split_hash():
    assert token_dtype(257) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(100_000) == np.uint32
    picks = [is_validation(i, 0.1) for i in range(20_000)]
    assert 0.08 < sum(picks) / len(picks) < 0.12
    assert picks == [is_validation(i, 0.1) for i in range(20_000)]
    assert not any(is_validation(i, 0.0) for i in range(1000))


def test_refuses_existing_output_unless_overwrite(tmp_path):
    write_text_corpus(tmp_path / "docs", 3)
    prep(tmp_path / "docs", tmp_path / "out", "byte", seq_len=8)
    with pytest.raises(Exception, match="exist"):
        prep(tmp_path / "docs", tmp_path / "out", "byte", seq_len=8)
    prep(tmp_path / "docs", tmp_path / "out", "byte", seq_len=16, mode="overwrite")
    with MDSDataset(tmp_path / "out", split="train") as ds:
        assert ds[0]["tokens"].shape == (16,)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="seq_len"):
        prep(tmp_path, tmp_path / "o", "byte", seq_len=1)
    with pytest.raises(SourceError):
        prep(Path(tmp_path / "missing"), tmp_path / "o", "byte", seq_len=8)
