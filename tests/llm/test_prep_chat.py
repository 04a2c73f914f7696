"""`tessera llm prep` of fine-tuning examples: MDS rows, the same bytes for any --workers, straight to S3."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chat_tokenizers import chatml_less, with_template
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.finetune.cache import prepared
from tessera.llm.finetune.prep import SUMMARY_NAME, prep_examples
from tessera.shards import MDSDataset
from tessera.storage import open_store

runner = CliRunner()
WORDS = "hi hello there bye goodbye what is two plus four six ok".split()


def conversation(rng: random.Random) -> dict:
    turns = rng.randint(1, 3)
    messages = [{"role": "system", "content": "be brief"}] if rng.random() < 0.5 else []
    for _ in range(turns):
        messages += [{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 6)))},
                     {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 8)))}]
    return {"messages": messages}


def write_examples(folder: Path, files: int = 3, per_file: int = 40, seed: int = 0) -> Path:
    """A folder of JSONL files mixing the three forms (several files: several chunks for the workers)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(folder / f"part{f}.jsonl", "w") as out:
            for _ in range(per_file):
                kind = rng.random()
                if kind < 0.6:
                    record = conversation(rng)
                elif kind < 0.85:
                    record = {"prompt": " ".join(rng.choices(WORDS, k=5)), "response": " ".join(rng.choices(WORDS, k=4))}
                else:
                    record = {"text": " ".join(rng.choices(WORDS, k=rng.randint(3, 30)))}
                out.write(json.dumps(record) + "\n")
    return folder


def dataset_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != SUMMARY_NAME}


def test_same_bytes_whatever_the_number_of_workers(tmp_path: Path) -> None:
    data = write_examples(tmp_path / "in")
    tok_dir = tmp_path / "tok"
    chatml_less().save_pretrained(tok_dir)
    digests, summaries = [], []
    for workers, tokenizer in ((1, str(tok_dir)), (2, chatml_less())):  # a folder, or an object sent to workers
        out = tmp_path / f"out{workers}"
        summary = prep_examples(data, out, tokenizer, seq_len=24, val_fraction=0.2, workers=workers,
                                size_limit="1kb")
        digests.append(dataset_digest(out))
        summaries.append({k: v for k, v in summary.to_dict().items()
                          if k not in ("seconds", "workers", "out", "tokenizer")})
    assert digests[0] == digests[1] and len(digests[0]) > 4  # several shards per split
    assert summaries[0] == summaries[1]
    s = summaries[0]
    assert s["records"] == 120 and s["examples"] + s["dropped_too_long"] + s["dropped_no_loss"] == 120
    assert s["rows"]["val"] > 0


def test_rows_hold_the_examples_and_the_padding_share_is_right(tmp_path: Path) -> None:
    data = write_examples(tmp_path / "in", files=1, per_file=30)
    out = tmp_path / "out"
    summary = prep_examples(data, out, with_template(), seq_len=32, val_fraction=0.0)
    ds = MDSDataset(str(out / "train"))
    rows = [ds[i] for i in range(len(ds))]
    assert len(rows) == summary.rows["train"] and not (out / "val").exists()
    padding = sum(int((r["sequence_ids"] == -1).sum()) for r in rows)
    assert padding == summary.padding_tokens["train"]
    assert summary.padding_share == pytest.approx(padding / (32 * len(rows)))
    assert sum(int(r["loss_mask"].sum()) for r in rows) == summary.loss_tokens
    assert json.loads((out / SUMMARY_NAME).read_text())["padding_share"] == summary.padding_share


def test_padded_rows_and_drop(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"prompt": ["ab", "abcdefghij", "a"], "response": ["cd", "x", "b"]}), path)
    summary = prep_examples(path, tmp_path / "out", "byte", seq_len=8, pack=False, truncation="drop")
    assert summary.dropped_too_long == 1 and summary.rows["train"] == 2
    ds = MDSDataset(str(tmp_path / "out" / "train"))
    assert ds[0]["tokens"].tolist()[:5] == [97, 98, 99, 100, 256]
    assert ds[0]["attention_mask"].tolist() == [1] * 5 + [0] * 3
    assert summary.padding_share == pytest.approx((3 + 5) / 16)


def test_straight_to_a_bucket_and_from_one(tmp_path: Path, s3_bucket: str) -> None:
    data = write_examples(tmp_path / "in", files=2, per_file=10)
    store = open_store(f"{s3_bucket}/raw")
    for f in sorted(data.iterdir()):
        store.put(f.name, f.read_bytes())
    summary = prep_examples(f"{s3_bucket}/raw", f"{s3_bucket}/sft", "byte", seq_len=64, workers=2)
    local = prep_examples(data, tmp_path / "local", "byte", seq_len=64)
    assert summary.rows == local.rows and summary.padding_tokens == local.padding_tokens
    remote = MDSDataset(f"{s3_bucket}/sft/train")
    here = MDSDataset(str(tmp_path / "local" / "train"))
    assert len(remote) == len(here)
    assert all(np.array_equal(remote[i]["tokens"], here[i]["tokens"]) for i in range(len(here)))
    assert json.loads(open_store(f"{s3_bucket}/sft").get(SUMMARY_NAME))["rows"] == summary.rows
    # the recipe path's cache keys a bucket input by its objects' sizes and ETags
    folder, cached = prepared(f"{s3_bucket}/raw", "byte", seq_len=64, cache_root=tmp_path / "cache")
    assert cached["rows"]["train"] == summary.rows["train"]
    assert prepared(f"{s3_bucket}/raw", "byte", seq_len=64, cache_root=tmp_path / "cache")[0] == folder


def test_cache_reuses_and_rekeys(tmp_path: Path) -> None:
    data = write_examples(tmp_path / "in", files=1, per_file=8)
    root = tmp_path / "cache"
    first, _ = prepared(str(data), "byte", seq_len=64, cache_root=root)
    mtime = (first / "train" / "index.json").stat().st_mtime_ns
    assert prepared(str(data), "byte", seq_len=64, cache_root=root)[0] == first
    assert (first / "train" / "index.json").stat().st_mtime_ns == mtime  # not prepared again
    assert prepared(str(data), "byte", seq_len=64, pack=False, cache_root=root)[0] != first
    with open(data / "part0.jsonl", "a") as f:
        f.write(json.dumps({"text": "one more"}) + "\n")
    assert prepared(str(data), "byte", seq_len=64, cache_root=root)[0] != first
    assert not list(root.glob("*.tmp-*"))


def test_cli(tmp_path: Path) -> None:
    data = write_examples(tmp_path / "in", files=1, per_file=12)
    out = tmp_path / "out"
    res = runner.invoke(app, ["llm", "prep", str(data), str(out), "--format", "auto", "--tokenizer", "byte",
                              "--seq-len", "48", "--no-pack", "--loss-on", "last_assistant", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["pack"] is False and summary["loss_on"] == "last_assistant" and summary["records"] == 12
    assert "attention_mask" in MDSDataset(str(out / "train"))[0]
    res = runner.invoke(app, ["llm", "prep", str(data), str(tmp_path / "o2"), "--format", "chat", "--tokenizer",
                              "byte", "--seq-len", "48"])
    assert res.exit_code != 0 and "needs field" in res.output  # a prompt/response record is not chat
    res = runner.invoke(app, ["llm", "prep", str(data), str(tmp_path / "o3"), "--format", "auto", "--tokenizer",
                              "byte", "--loss-on", "some"])
    assert res.exit_code == 2 and "loss_on: Input should be 'all_assistant', 'last_assistant' or 'all'" in res.output


def test_one_process_prepares_while_the_others_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks sharing a cache: the first takes the lock and prepares, the rest block on it, then reuse."""
    import threading

    import tessera.llm.finetune.cache as cache

    data = write_examples(tmp_path / "in", files=1, per_file=8)
    calls: list[int] = []
    real = cache.prep_examples

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "prep_examples", counted)
    folders: list[Path] = []
    threads = [threading.Thread(target=lambda: folders.append(
        prepared(str(data), "byte", seq_len=64, cache_root=tmp_path / "c")[0])) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(folders)) == 1 and len(folders) == 3
