"""The base model a LoRA run started from is fingerprinted: after its weights change (re-saved with other
values, same shapes and sizes), `tessera train` refuses to resume and `tessera llm export` refuses to
export, each in one line naming the folder (exit 1), and both proceed when told to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import Result
from hf_fixtures import chat_tokenizer, tiny_llama, write_chat_jsonl
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.hf import fingerprint
from tessera.llm.hf.fingerprint import changed_files, folder_fingerprint


def tessera(*args: str) -> Result:
    """The `tessera` command, in this process (the models are imported once for the whole test)."""
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("cached", [False, True])
def test_fingerprint_follows_the_bytes_not_the_docs_or_times(tmp_path: Path, cached: bool) -> None:
    cache = tmp_path / "cache" if cached else None
    base = tiny_llama(tmp_path / "base", seed=0)
    before = folder_fingerprint(base, cache)
    assert "model.safetensors" in before["files"] and "config.json" in before["files"]
    (base / "README.md").write_text("a model card\n")
    os.utime(base / "model.safetensors", (1, 1))
    assert folder_fingerprint(base, cache) == before
    size = (base / "model.safetensors").stat().st_size
    tiny_llama(base, seed=1)  # other weights, the same shapes: the file keeps its size
    assert (base / "model.safetensors").stat().st_size == size
    assert changed_files(before, folder_fingerprint(base, cache)) == ["model.safetensors"]
    assert folder_fingerprint(base, cache) == folder_fingerprint(base)  # the record agrees with the bytes


def test_a_recorded_fingerprint_hashes_only_changed_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tiny_llama(tmp_path / "base", seed=0)
    first = folder_fingerprint(base, tmp_path / "cache")
    hashed: list[str] = []
    digest = fingerprint.file_digest
    monkeypatch.setattr(fingerprint, "file_digest", lambda p: hashed.append(p.name) or digest(p))
    assert folder_fingerprint(base, tmp_path / "cache") == first and hashed == []
    (base / "config.json").write_text((base / "config.json").read_text() + "\n")
    folder_fingerprint(base, tmp_path / "cache")
    assert hashed == ["config.json"]


def test_resume_and_export_refuse_a_changed_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = chat_tokenizer()
    base = tiny_llama(tmp_path / "base", seed=0, tokenizer=tokenizer)
    write_chat_jsonl(tmp_path / "chat.jsonl", 120)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.chdir(tmp_path)
    save = tmp_path / "ckpt"
    train = ["train", "finetune-lora-tiny.yaml", f"model.pretrained={base}", f"data.train.path={tmp_path / 'chat.jsonl'}",
             f"save_folder={save}", "save_interval=2ba", "log_interval=2ba"]
    done = tessera(*train, "max_duration=2ba")
    assert done.exit_code == 0, done.output[-3000:]

    tiny_llama(base, seed=1, tokenizer=tokenizer)  # the base is replaced by another model of the same shape
    resumed = tessera(*train, "max_duration=4ba")
    assert resumed.exit_code == 1, resumed.output[-3000:]
    assert f"model.pretrained={base} is not the base" in resumed.output
    assert "model.safetensors" in resumed.output and "model.allow_changed_base=true" in resumed.output
    assert "Traceback" not in resumed.output
    assert [p.name for p in save.iterdir() if p.name.startswith("ep")] == ["ep0-ba2"]  # nothing was saved

    for extra in ([], ["--adapter-only"]):
        exported = tessera("llm", "export", str(save), str(tmp_path / "out"), "--format", "hf", *extra)
        assert exported.exit_code == 1, exported.output[-3000:]
        assert f"model.pretrained={base} is not the base" in exported.output
        assert "--allow-changed-base" in exported.output and "Traceback" not in exported.output
    assert not (tmp_path / "out").exists()

    forced = tessera("llm", "export", str(save), str(tmp_path / "out"), "--format", "hf", "--adapter-only",
                     "--allow-changed-base")
    assert forced.exit_code == 0, forced.output[-3000:]
    assert (tmp_path / "out" / "adapter_model.safetensors").exists()
    resumed = tessera(*train, "max_duration=4ba", "model.allow_changed_base=true")
    assert resumed.exit_code == 0, resumed.output[-3000:]
    # The checkpoints after the override record the base they now continue from: export accepts it.
    exported = tessera("llm", "export", str(save), str(tmp_path / "out2"), "--format", "hf")
    assert exported.exit_code == 0, exported.output[-3000:]


def test_a_cache_folder_that_cannot_be_written_is_passed_over(tmp_path: Path) -> None:
    base = tiny_llama(tmp_path / "base", seed=0)
    (tmp_path / "not-a-folder").write_text("")
    assert folder_fingerprint(base, tmp_path / "not-a-folder") == folder_fingerprint(base)
