"""A recipe fine-tunes from `data.train.path=FILE.jsonl`: prepared once, streamed, resumed like streams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.recipe import RecipeError, load_recipe

runner = CliRunner()


def train(cwd: Path, data: Path, *extra: str) -> tuple[list[dict], str]:
    cwd.mkdir(parents=True, exist_ok=True)
    cache = cwd.parent / "prep-cache"
    args = ["train", "tiny-cpu.yaml", "model.d_model=32", "model.n_layers=1", "model.max_seq_len=64",
            "data.train.streams=[]", f"data.train.path={data}", f"data.train.prep_cache={cache}",
            "data.eval.streams=[]", f"data.eval.path={data}", f"data.eval.prep_cache={cache}",
            "data.eval.max_batches=2", "global_train_batch_size=4", "device_train_microbatch_size=4",
            "max_duration=4ba", "eval_interval=4ba", "log_interval=1ba", "loggers=[jsonl]", "torch_threads=1",
            f"save_folder={cwd}/ckpt", "save_interval=2ba", *extra]
    import os

    before = os.getcwd()
    os.chdir(cwd)
    try:
        res = runner.invoke(app, args)
    finally:
        os.chdir(before)
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (cwd / "logs" / "tiny-cpu" / "metrics.jsonl").open()]
    return rows, res.output


def losses(rows: list[dict]) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_fine_tunes_from_a_jsonl_file_and_resumes_the_same(chat_file: Path, tmp_path: Path) -> None:
    rows, output = train(tmp_path / "whole", chat_file)
    whole = losses(rows)
    assert sorted(whole) == [1, 2, 3, 4] and all(v == v for v in whole.values())
    assert any("eval/loss" in r for r in rows)
    assert "packed rows of 64" in output and "padding" in output
    padding = [r["data/padding_share"] for r in rows if "data/padding_share" in r]  # logged once, at the start
    assert len(padding) == 1 and 0 <= padding[0] < 1
    assert len(list((tmp_path / "prep-cache").glob("*/train/index.json"))) == 1  # one cache for train and eval
    # stop after 2 batches, then autoresume to 4: the same batches, the same losses
    train(tmp_path / "split", chat_file, "max_duration=2ba")
    rows, _ = train(tmp_path / "split", chat_file, "autoresume=true")
    assert losses(rows) == whole


def test_path_and_streams_exclude_each_other(chat_file: Path) -> None:
    with pytest.raises(RecipeError, match="not both"):
        load_recipe("tiny-cpu.yaml", [f"data.train.path={chat_file}"])
    with pytest.raises(RecipeError, match="loss_on"):
        load_recipe("tiny-cpu.yaml", ["data.train.streams=[]", f"data.train.path={chat_file}",
                                      "data.train.loss_on=everything"])
    recipe = load_recipe("tiny-cpu.yaml", ["data.train.streams=[]", f"data.train.path={chat_file}",
                                           "data.train.format=chat", "data.train.pack=false"])
    assert recipe.data.train.path == str(chat_file) and recipe.data.train.pack is False


def test_unreadable_path_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"question": 1}\n')
    res = runner.invoke(app, ["train", "tiny-cpu.yaml", "data.train.streams=[]",
                              f"data.train.path={tmp_path / 'bad.jsonl'}", f"data.train.prep_cache={tmp_path}/c",
                              "data.eval=null", "max_duration=1ba", "save_folder=null", "autoresume=false"])
    assert res.exit_code != 0 and "none of chat" in res.output
