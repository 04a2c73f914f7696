"""`tessera train` and `tessera llm eval` on LLM Foundry's token shards, written by MosaicML's own writer:
`ndarray:int32` tokens (Foundry since mid-2024) and `bytes` of int64 ids (its older ConcatTokensDataset)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from anchors import MDSWriter
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.eval import mds_batches, perplexity
from tessera.llm.model import GPT, GPTConfig
from tessera.llm.recipe import RecipeError
from tessera.llm.tokens import TOKEN_DTYPES, TokenColumnError, TokenWindows, token_collate
from tessera.shards import ShardWriter

runner = CliRunner()
L = 32
WINDOWS = {"train": 48, "val": 8}
# How each layout stores one window of token ids (what Tessera's prep, and Foundry old and new, write).
LAYOUTS = {
    "tessera": ({"tokens": f"ndarray:uint16:{L}"}, lambda w: w.astype(np.uint16)),
    "foundry_int32": ({"tokens": "ndarray:int32"}, lambda w: w.astype(np.int32)),
    "foundry_bytes": ({"tokens": "bytes"}, lambda w: np.asarray(w.tolist()).tobytes()),  # as Foundry did
}


def windows(split: str) -> np.ndarray:
    rng = np.random.default_rng(0 if split == "train" else 1)
    return rng.integers(0, 257, size=(WINDOWS[split], L))  # the byte tokenizer's ids


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, (columns, encode) in LAYOUTS.items():
        root = tmp_path_factory.mktemp(name)
        for split in WINDOWS:
            if name == "tessera":
                with ShardWriter(root / split, columns) as writer:
                    for w in windows(split):
                        writer.write({"tokens": encode(w)})
            else:
                with MDSWriter(out=str(root / split), columns=columns) as writer:
                    for w in windows(split):
                        writer.write({"tokens": encode(w)})
        out[name] = root
    return out


def train_losses(data: Path, cwd: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> list[float]:
    cwd.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(cwd)
    args = ["train", "tiny-cpu.yaml", "model.d_model=32", "model.n_layers=1", f"model.max_seq_len={L}",
            f"data.train.streams.0.remote={data}", f"data.eval.streams.0.remote={data}", "data.eval.max_batches=2",
            "global_train_batch_size=4", "device_train_microbatch_size=4", "max_duration=3ba", "eval_interval=3ba",
            "log_interval=1ba", "loggers=[jsonl]", "torch_threads=1", "save_folder=null", "autoresume=false", *extra]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (cwd / "logs" / "tiny-cpu" / "metrics.jsonl").open()]
    return [r[k] for r in rows for k in sorted(r) if k.endswith("loss")]


def test_train_on_foundry_token_shards_matches_tessera_windows(datasets, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    losses = {name: train_losses(path, tmp_path / name, monkeypatch) for name, path in datasets.items()}
    assert len(losses["tessera"]) >= 4  # three training steps and an evaluation
    assert losses["foundry_int32"] == losses["tessera"]  # the same token ids, bit for bit the same run
    assert losses["foundry_bytes"] == losses["tessera"]


def test_eval_perplexity_on_foundry_token_shards(datasets) -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=257, max_seq_len=L)).eval()
    want = perplexity(model, mds_batches(datasets["tessera"], "val", batch_size=3))
    for name in ("foundry_int32", "foundry_bytes"):
        batch = next(mds_batches(datasets[name], "val", batch_size=3))
        assert batch["tokens"].dtype == torch.int64 and torch.equal(batch["tokens"], torch.from_numpy(windows("val")[:3]))
        assert perplexity(model, mds_batches(datasets[name], "val", batch_size=3)) == want


def test_bytes_tokens_follow_token_encoding_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Foundry's `token_encoding_type` for bytes columns: int32 bytes read as int64 would be garbage."""
    root = tmp_path / "data"
    for split in WINDOWS:
        with MDSWriter(out=str(root / split), columns={"tokens": "bytes"}) as writer:
            for w in windows(split):
                writer.write({"tokens": w.astype(np.int32).tobytes()})
    res = runner.invoke(app, ["train", "tiny-cpu.yaml", f"model.max_seq_len={L}", f"data.train.streams.0.remote={root}",
                              "data.train.token_encoding_type=int16", "--print-config"])
    assert res.exit_code == 0 and "token_encoding_type: int16" in res.output
    res = runner.invoke(app, ["train", "tiny-cpu.yaml", "data.train.token_encoding_type=float32", "--print-config"])
    assert res.exit_code == 2 and "token_encoding_type" in res.output
    collate = token_collate([("s", "bytes")], L, "int32")
    assert torch.equal(collate({"tokens": [w.astype(np.int32).tobytes() for w in windows("val")]})["tokens"],
                       torch.from_numpy(windows("val")))


def test_text_column_is_a_one_line_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    for split in WINDOWS:
        with MDSWriter(out=str(root / split), columns={"tokens": "str"}) as writer:
            writer.write({"tokens": "not token ids"})
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["train", "tiny-cpu.yaml", f"model.max_seq_len={L}",
                              f"data.train.streams.0.remote={root}", f"data.eval.streams.0.remote={root}"])
    assert res.exit_code == 2
    assert "column `tokens` is str" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("encodings,seq_len,message", [
    ([("a", "ndarray:uint16:64")], L, "ndarray:uint16:64 windows but model.max_seq_len is 32"),
    ([("a", "ndarray:float32")], L, "column `tokens` is ndarray:float32"),
    ([("a", "ndarray:int32:4,8")], L, "model.max_seq_len is 32"),
    ([("a", "jpeg")], L, "column `tokens` is jpeg"),
    ([("a", None)], L, "a: the dataset has no `tokens` column"),
    ([("a", "ndarray:int32"), ("b", "bytes")], L, r"store `tokens` differently \(a: ndarray:int32, b: bytes\)"),
])
def test_unusable_token_columns_fail_before_reading(encodings, seq_len, message) -> None:
    with pytest.raises(TokenColumnError, match=message):
        token_collate(encodings, seq_len)
    assert issubclass(TokenColumnError, RecipeError)  # `tessera train` reports it as a usage error


def test_fixed_windows_need_no_collate_and_bad_samples_are_errors() -> None:
    assert token_collate([("a", f"ndarray:uint16:{L}"), ("b", f"ndarray:uint16:{L}")], L) is None
    collate = TokenWindows(L)
    with pytest.raises(TokenColumnError, match="holds 31 token ids but model.max_seq_len is 32"):
        collate({"tokens": [np.zeros(31, np.int32)]})
    with pytest.raises(TokenColumnError, match="12 bytes is not a whole number of int64"):
        collate({"tokens": [b"\0" * 12]})
    with pytest.raises(TokenColumnError, match="float32 array of shape"):
        collate({"tokens": [np.zeros(L, np.float32)]})


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(TOKEN_DTYPES), length=st.integers(1, 40), extra=st.integers(0, 5),
       rows=st.integers(1, 4), seed=st.integers(0, 2**32 - 1), as_bytes=st.booleans())
def test_token_windows_decode_every_integer_dtype(dtype, length, extra, rows, seed, as_bytes) -> None:
    info = np.iinfo(dtype)
    high = min(int(info.max), 2**62)
    data = np.random.default_rng(seed).integers(max(int(info.min), -(2**62)), high, size=(rows, length + extra),
                                                dtype=np.int64).astype(dtype)
    values = [r.tobytes() if as_bytes else r for r in data]
    got = TokenWindows(length, dtype)({"tokens": values})["tokens"]
    assert got.dtype == torch.int64 and got.shape == (rows, length)
    assert np.array_equal(got.numpy(), data[:, :length].astype(np.int64))
