"""A relative `model.pretrained` is made absolute when the recipe is loaded, so the run config names the
model wherever `tessera llm export` (or a resume) is started from; URLs are kept as given."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_fixtures import chat_tokenizer, tiny_llama, write_chat_jsonl
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.recipe import load_recipe


def test_local_paths_become_absolute_and_urls_stay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe("finetune-lora-tiny.yaml", ["model.pretrained=./models/../tiny", "data.train.path=c.jsonl"])
    assert recipe.model["pretrained"] == str(tmp_path / "tiny")
    assert recipe.dump()["model"]["pretrained"] == str(tmp_path / "tiny")
    for url in ("s3://bucket/models/tiny", "file:///models/tiny"):
        recipe = load_recipe("finetune-lora-tiny.yaml", [f"model.pretrained={url}", "data.train.path=c.jsonl"])
        assert recipe.model["pretrained"] == url


def test_export_from_another_folder_finds_a_relative_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    tiny_llama(work / "tiny", seed=0, tokenizer=chat_tokenizer())
    write_chat_jsonl(work / "chat.jsonl", 40)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.chdir(work)
    done = CliRunner().invoke(app, ["train", "finetune-lora-tiny.yaml", "model.pretrained=./tiny",
                                    "data.train.path=chat.jsonl", "save_folder=./ckpt", "max_duration=2ba",
                                    "save_interval=2ba", "log_interval=2ba"])
    assert done.exit_code == 0, done.output[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    exported = CliRunner().invoke(app, ["llm", "export", str(work / "ckpt"), "out", "--format", "hf",
                                        "--adapter-only"])
    assert exported.exit_code == 0, exported.output[-3000:]
    assert (elsewhere / "out" / "adapter_config.json").is_file()
