"""Fine-tuning rows prepared into a bucket (`tessera llm prep --format chat`) stream from a recipe's
`data.train.streams` with their labels: the same batches as `data.train.path` gives, the same losses
after a resume; streams of different columns are refused, naming them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.finetune import prep_examples
from tessera.llm.recipe import RecipeError, load_recipe
from tessera.llm.train_run import build_loader, recipe_tokenizer

runner = CliRunner()
MODEL = ["model.d_model=32", "model.n_layers=1", "model.max_seq_len=64"]


def first_batch(overrides: list[str]) -> dict[str, torch.Tensor]:
    recipe = load_recipe("tiny-cpu.yaml", [*MODEL, "data.train.num_canonical_nodes=1", *overrides])
    loader = build_loader(recipe.data.train, 4, 64, recipe_tokenizer(recipe))
    return next(iter(loader))


@pytest.mark.parametrize("pack", [True, False])
def test_bucket_rows_give_the_batches_of_path(chat_file: Path, tmp_path: Path, s3_bucket: str, pack: bool) -> None:
    prep_examples(chat_file, f"{s3_bucket}/sft", "byte", seq_len=64, fmt="chat", pack=pack)
    option = f"data.train.pack={str(pack).lower()}"
    streamed = first_batch([f"data.train.streams.0.remote={s3_bucket}/sft",
                            f"data.train.streams.0.local={tmp_path / 'cache'}", option])
    from_path = first_batch(["data.train.streams=[]", f"data.train.path={chat_file}", "data.train.format=chat",
                             f"data.train.prep_cache={tmp_path / 'prep'}", option])
    columns = ["position_ids", "sequence_ids"] if pack else ["attention_mask"]
    assert sorted(streamed) == sorted(from_path) == sorted(["tokens", "labels", *columns])
    for name, value in from_path.items():
        assert torch.equal(streamed[name], value), name
    assert (streamed["labels"] == -100).any() and (streamed["labels"] != -100).any()  # prompts carry no loss


def train(cwd: Path, remote: str, *extra: str) -> list[dict]:
    cwd.mkdir(parents=True, exist_ok=True)
    args = ["train", "tiny-cpu.yaml", *MODEL, f"data.train.streams.0.remote={remote}",
            f"data.train.streams.0.local={cwd / 'cache'}", "data.eval=null", "global_train_batch_size=4",
            "device_train_microbatch_size=4", "max_duration=4ba", "log_interval=1ba", "loggers=[jsonl]",
            "torch_threads=1", f"save_folder={cwd}/ckpt", "save_interval=2ba", f"log_dir={cwd}/logs", *extra]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in (cwd / "logs" / "metrics.jsonl").open()]


def losses(rows: list[dict]) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_trains_from_bucket_rows_and_resumes_the_same(chat_file: Path, tmp_path: Path, s3_bucket: str) -> None:
    summary = prep_examples(chat_file, f"{s3_bucket}/sft", "byte", seq_len=64, fmt="chat")
    rows = train(tmp_path / "whole", f"{s3_bucket}/sft")
    whole = losses(rows)
    assert sorted(whole) == [1, 2, 3, 4] and all(v == v for v in whole.values())
    # the data's prep summary: logged once when the run starts, and in the run config
    logged = [r for r in rows if "data/padding_share" in r]
    assert len(logged) == 1 and logged[0]["step"] == 0
    assert logged[0]["data/padding_share"] == pytest.approx(summary.padding_share)
    assert logged[0]["data/examples_truncated"] == summary.truncated
    assert logged[0]["data/examples_dropped"] == summary.dropped_too_long + summary.dropped_no_loss
    meta = json.loads((tmp_path / "whole" / "ckpt" / "ep0-ba4" / "meta.json").read_text())
    assert meta["config"]["data_prep"]["padding_share"] == pytest.approx(summary.padding_share)
    train(tmp_path / "split", f"{s3_bucket}/sft", "max_duration=2ba")
    assert losses(train(tmp_path / "split", f"{s3_bucket}/sft", "autoresume=true")) == whole


def test_streams_of_different_columns_are_refused(chat_file: Path, tmp_path: Path, prepped: Path) -> None:
    prep_examples(chat_file, tmp_path / "sft", "byte", seq_len=32, fmt="chat")
    streams = f"[{{remote: {tmp_path / 'sft'}, split: train}}, {{remote: {prepped}, split: train}}]"
    recipe = load_recipe("tiny-cpu.yaml", [*MODEL, f"data.train.streams={streams}"])
    with pytest.raises(RecipeError, match="different columns") as caught:
        build_loader(recipe.data.train, 4, 32, recipe_tokenizer(recipe))
    message = str(caught.value)
    assert os.fspath(tmp_path / "sft") in message and os.fspath(prepped) in message and "loss_mask" in message
