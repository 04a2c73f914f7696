"""The shapes of well-known pretrained models, so a recipe can be planned before the model is on disk.

    architecture_named("Meta-Llama-3-8B-Instruct")   # -> "llama-3-8b"
    architecture_config("llama-3-8b")                 # -> the transformers config keys of that shape

`tessera train RECIPE --plan` reads the model's own config.json when `model.pretrained` is a local folder;
before that (a bucket path, a hub id, or `???`), the recipe's `model.architecture`, or the last part of
`model.pretrained` (`s3://bucket/models/Meta-Llama-3-8B`), names an entry here. Each entry holds only
what the model's published config.json states (transformers key names), enough for transformers to
build the same model on the meta device and count its parameters exactly (Llama-3-8B: 8,030,261,248).
Names match without case and without a leading `Meta-`; `-Instruct` variants share their base's shape.
"""

from __future__ import annotations

from typing import Any

_LLAMA_3_8B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
               "tie_word_embeddings": False}
_LLAMA_3_70B = {**_LLAMA_3_8B, "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
                "intermediate_size": 28672}
_LLAMA_3_2 = {"model_type": "llama", "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
              "tie_word_embeddings": True, "max_position_embeddings": 131072}
_MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
               "tie_word_embeddings": False, "max_position_embeddings": 32768}
_QWEN_2_5_7B = {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
                "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
                "tie_word_embeddings": False}

ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama-3-8b": {**_LLAMA_3_8B, "max_position_embeddings": 8192},
    "llama-3.1-8b": {**_LLAMA_3_8B, "max_position_embeddings": 131072},
    "llama-3-70b": {**_LLAMA_3_70B, "max_position_embeddings": 8192},
    "llama-3.1-70b": {**_LLAMA_3_70B, "max_position_embeddings": 131072},
    "llama-3.2-1b": {**_LLAMA_3_2, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32},
    "llama-3.2-3b": {**_LLAMA_3_2, "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24},
    "mistral-7b-v0.1": _MISTRAL_7B,
    "mistral-7b-v0.2": _MISTRAL_7B,
    "mistral-7b-v0.3": {**_MISTRAL_7B, "vocab_size": 32768},
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-7b": {**_QWEN_2_5_7B, "max_position_embeddings": 131072},
    "qwen2.5-7b-instruct": {**_QWEN_2_5_7B, "max_position_embeddings": 32768},  # its own: fewer positions
}


def architecture_named(name: str) -> str | None:
    """The table's key for a model name (`Meta-Llama-3-8B-Instruct`, `Mistral-7B-Instruct-v0.2`), or None."""
    key = name.strip().lower().removeprefix("meta-")
    if key in ARCHITECTURES:
        return key
    base = key.replace("-instruct", "")
    return base if base in ARCHITECTURES else None


def architecture_config(name: str) -> dict[str, Any]:
    """The transformers config keys of a named architecture; ValueError listing the known names."""
    key = architecture_named(name)
    if key is None:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    return dict(ARCHITECTURES[key])
