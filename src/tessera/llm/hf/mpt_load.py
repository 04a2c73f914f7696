"""Every source of an MPT-shaped model as Tessera's GPT: a Composer checkpoint, a transformers MPT folder,
and Tessera's own exports and checkpoints.

    model, tokenizer = load_gpt("s3://bucket/run/checkpoints/ep0-ba100-rank0.pt")   # Composer (Foundry)
    model, tokenizer = load_gpt("./mpt-hf")        # convert_composer_to_hf.py's folder, or MptForCausalLM's
    model, tokenizer = load_gpt("runs/r1/checkpoints")                              # Tessera (llm/export.py)

What a path is, is `resolve_model_source`'s to say; Tessera's own formats stay llm/export.py's, this module
adds the MPT ones (hf/mpt.py maps them, hf/composer.py reads Composer's files). The model comes back in
eval mode with float32 weights; the tokenizer is the transformers one saved with it, or None.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tessera.llm.export import ExportError, load_model
from tessera.llm.hf.cache import local_model_folder
from tessera.llm.hf.composer import checkpoint_version, composer_tokenizer, read_composer_checkpoint
from tessera.llm.hf.mpt import empty_gpt, gpt_from_mpt
from tessera.llm.model import GPT, GPTConfig
from tessera.llm.model_source import resolve_model_source

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_gpt(path: str | os.PathLike[str], mpt_config: Mapping[str, Any] | None = None) -> tuple[GPT, Any]:
    """Tessera's GPT from any source that holds one (module docstring). `mpt_config`: the MPT config of a
    Composer checkpoint that has none. A transformers folder of another architecture is an ExportError."""
    url = os.fspath(path)
    source = resolve_model_source(url)
    if source.kind == "composer":
        return load_composer_model(url, mpt_config)
    if source.kind == "transformers":
        if (source.config or {}).get("model_type") != "mpt":
            raise ExportError(f"{url}: a transformers {source.config.get('model_type')!r} model, not an MPT; only MPT "
                              "models load as Tessera's GPT")
        return load_mpt_folder(url)
    return load_model(url)


def load_composer_model(url: str, mpt_config: Mapping[str, Any] | None = None) -> tuple[GPT, Any]:
    """The GPT with a Composer checkpoint's weights, and the tokenizer saved in it (None if none)."""
    ckpt = read_composer_checkpoint(url, mpt_config)
    model = empty_gpt(ckpt.config)
    model.load_state_dict(ckpt.model)
    return model.eval(), composer_tokenizer(ckpt)


def describe_composer(url: str) -> tuple[GPTConfig, Any]:
    """(GPTConfig, tokenizer) of a Composer checkpoint, without building the model; read once per version
    of the file in a process: a run asks for its tokenizer and its sequence length before it loads the
    weights (hf/load.py), and each would otherwise read the whole file again."""
    return _described(url, checkpoint_version(url))


@functools.lru_cache(maxsize=4)
def _described(url: str, version: str) -> tuple[GPTConfig, Any]:
    ckpt = read_composer_checkpoint(url)
    return ckpt.config, composer_tokenizer(ckpt)


def load_mpt_folder(url: str, cache_dir: str | None = None) -> tuple[GPT, Any]:
    """The GPT of a transformers MPT folder (local, or in a bucket: copied once per node, hf/cache.py)."""
    folder = local_model_folder(url, cache_dir)
    config = json.loads((folder / "config.json").read_text())
    model = gpt_from_mpt(folder_weights(folder, url), config, url)
    tokenizer = None
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return model, tokenizer


def folder_weights(folder: Path, url: str) -> dict[str, torch.Tensor]:
    """Every tensor of a transformers folder: model.safetensors or pytorch_model.bin (Foundry's converter
    writes the latter), or the shards their index.json lists."""
    from safetensors.torch import load_file

    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        files = [folder / single] if (folder / single).is_file() else []
        if not files and (folder / index).is_file():
            weight_map = json.loads((folder / index).read_text()).get("weight_map") or {}
            files = [folder / name for name in sorted(set(weight_map.values()))]
        if files:
            state: dict[str, torch.Tensor] = {}
            for file in files:
                state.update(load_file(file) if file.suffix == ".safetensors"
                             else torch.load(file, map_location="cpu", weights_only=True))
            return state
    raise ExportError(f"{url}: no weights (model.safetensors or pytorch_model.bin, or their index.json)")
