"""`tessera llm ...` smoke tests through typer's CliRunner: the commands wire the library correctly."""

from __future__ import annotations

import json

from llm_helpers import small_model, write_text_corpus
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.export import save_pretrained
from tessera.llm.tokenizer import load_tokenizer
from tessera.shards import MDSDataset

runner = CliRunner()


def run(*args: str):
    result = runner.invoke(app, ["llm", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result


def test_tokenizer_prep_eval_generate(tmp_path):
    write_text_corpus(tmp_path / "docs", 30, seed=9)
    tok_path = tmp_path / "tok.json"
    run("tokenizer", "train", tmp_path / "docs", "--vocab-size", 320, "--out", tok_path)
    tok = load_tokenizer(tok_path)
    assert tok.vocab_size <= 320

    data = tmp_path / "data"
    result = run("prep", tmp_path / "docs", data, "--tokenizer", tok_path, "--seq-len", 16,
                 "--val-fraction", 0.2, "--json")
    summary = json.loads(result.stdout)
    assert summary["documents"] == 30 and summary["dtype"] == "uint16"
    with MDSDataset(data, split="val") as ds:
        assert len(ds) == summary["windows"]["val"] > 0

    export = tmp_path / "export"
    save_pretrained(small_model(seed=1, vocab_size=320), export, tokenizer=tok)
    result = run("eval", export, "--data", data, "--task", "tiny_mc", "--batch-size", 4, "--json")
    scores = json.loads(result.stdout)
    assert scores["perplexity"]["tokens"] == summary["windows"]["val"] * 15
    assert 0.0 <= scores["mc/tiny_mc"]["accuracy"] <= 1.0

    outs = [json.loads(run("generate", export, "--prompt", "def value", "--max-new-tokens", 12, "--greedy",
                           "--json", *flags).stdout) for flags in ([], ["--no-cache"])]
    assert outs[0]["tokens"] == outs[1]["tokens"] and len(outs[0]["tokens"]) >= 1
    streamed = run("generate", export, "--prompt", "def", "--max-new-tokens", 5, "--seed", 0, "--top-k", 20)
    assert streamed.stdout.startswith("def")


def test_export_from_checkpoint_and_info(tmp_path):
    from tessera.train.checkpoint import CheckpointManager, capture_state
    from tessera.train.time import Timestamp

    model = small_model(seed=2)
    with CheckpointManager(tmp_path / "ckpt", async_save=False) as mgr:
        mgr.save(capture_state(model, timestamp=Timestamp(batch=1), config={"model": model.cfg.to_dict()}))
    run("export", tmp_path / "ckpt", tmp_path / "out", "--tokenizer", "byte")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tokenizer"] == "tokenizer.json"
    result = run("generate", tmp_path / "out", "--prompt", "hi", "--max-new-tokens", 3, "--greedy", "--json")
    assert len(json.loads(result.stdout)["tokens"]) <= 3

    rows = json.loads(run("info", "tiny", "mpt-7b", "--json").stdout)
    assert [r["name"] for r in rows] == ["tiny", "mpt-7b"] and 6.5e9 < rows[1]["params"] < 6.8e9


def test_errors_are_one_line_messages(tmp_path):
    result = runner.invoke(app, ["llm", "prep", str(tmp_path), str(tmp_path / "o"), "--tokenizer",
                                 str(tmp_path / "nope.json")])
    assert result.exit_code == 1 and "no such tokenizer file" in " ".join(result.output.split())
    result = runner.invoke(app, ["llm", "generate", str(tmp_path), "--prompt", "x"])
    assert result.exit_code == 1 and "neither a model export" in " ".join(result.output.split())
