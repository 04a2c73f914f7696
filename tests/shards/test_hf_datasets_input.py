"""Hugging Face `datasets` on disk as inputs of `convert` and `prep`: `save_to_disk` folders and Parquet
folders as the Hub lays them out (data/*.parquet beside a README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from tessera.llm.prep import prep  # noqa: E402
from tessera.shards import MDSDataset  # noqa: E402
from tessera.shards.convert import convert  # noqa: E402
from tessera.shards.sources import SourceError, detect_format  # noqa: E402

ROWS = [{"id": i, "text": f"document {i} " + "word " * (i % 13)} for i in range(2500)]


def _rows(url: Path) -> list[dict]:
    ds = MDSDataset(str(url))
    return [{"id": int(ds[i]["id"]), "text": ds[i]["text"]} for i in range(len(ds))]


def test_save_to_disk_folder_converts_in_order(tmp_path: Path):
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(saved), num_shards=3)
    assert detect_format(saved) == "arrow"
    summary = convert(saved, tmp_path / "mds", workers=2)
    assert summary.format == "arrow" and summary.columns == {"id": "int", "text": "str"}
    assert _rows(tmp_path / "mds") == ROWS


def test_dataset_dict_names_its_splits(tmp_path: Path):
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:10]),
                                   "test": datasets.Dataset.from_list(ROWS[10:20])})
    splits.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(SourceError, match="DatasetDict; convert one split"):
        convert(tmp_path / "dict", tmp_path / "mds")
    convert(tmp_path / "dict" / "test", tmp_path / "mds")
    assert _rows(tmp_path / "mds") == ROWS[10:20]


def test_hub_parquet_folder_with_a_readme(tmp_path: Path):
    folder = tmp_path / "hub"
    (folder / "data").mkdir(parents=True)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# a dataset card\n")
    whole = datasets.Dataset.from_list(ROWS)
    for n in range(2):
        whole.shard(2, n, contiguous=True).to_parquet(str(folder / "data" / f"train-0000{n}-of-00002.parquet"))
    assert detect_format(folder) == "parquet"
    convert(folder, tmp_path / "mds")
    assert _rows(tmp_path / "mds") == ROWS


def test_prep_reads_a_save_to_disk_folder(tmp_path: Path):
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(saved), num_shards=2)
    summary = prep(saved, tmp_path / "tokens", "byte", seq_len=32, val_fraction=0.0)
    assert summary.documents == len(ROWS)
    expected = sum(len(r["text"].encode()) + 1 for r in ROWS)  # byte tokens plus EOS per document
    assert summary.tokens == expected
