"""model.pretrained=s3://...: downloaded once per node into a cache, atomically, the local ranks sharing it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from hf_fixtures import tiny_llama

from tessera.llm.hf.cache import local_model_folder
from tessera.llm.hf.config import PretrainedSpec
from tessera.llm.hf.load import load_hf
from tessera.storage import open_store


def upload(folder: Path, url: str) -> None:
    store = open_store(url)
    for file in folder.iterdir():
        store.put_file(file.name, file)


def test_a_bucket_model_is_fetched_once_and_refetched_when_it_changes(tmp_path, s3_bucket):
    folder = tiny_llama(tmp_path / "llama", seed=4)
    url = f"{s3_bucket}/models/tiny-llama"
    upload(folder, url)
    cache = tmp_path / "cache"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(local_model_folder(url, cache))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 3  # three local ranks, one copy
    local = results[0]
    assert sorted(p.name for p in local.iterdir()) == sorted(p.name for p in folder.iterdir())
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [local.name]  # no partial folder left
    stamp = (local / "model.safetensors").stat().st_mtime_ns
    assert local_model_folder(url, cache) == local and (local / "model.safetensors").stat().st_mtime_ns == stamp

    model, tokenizer = load_hf(PretrainedSpec(pretrained=url, cache_dir=str(cache)))
    x = torch.randint(0, 300, (1, 8))
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    torch.testing.assert_close(model.eval()(x), reference(input_ids=x).logits)
    assert tokenizer.chat_template

    open_store(url).put("config.json", (folder / "config.json").read_bytes() + b"\n")  # a new upload
    assert local_model_folder(url, cache) != local


def test_missing_folders_name_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.pretrained"):
        local_model_folder(tmp_path / "nothing-here")
    with pytest.raises(FileNotFoundError, match="model.pretrained"):
        local_model_folder("memory://no-such-bucket/models/x", tmp_path / "cache")
