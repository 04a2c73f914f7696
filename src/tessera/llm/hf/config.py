"""The recipe sections of fine-tuning: `model.pretrained` (a Hugging Face model to start from) and `lora`.

    model: {pretrained: ./llama-3-8b, dtype: bfloat16}   # a transformers folder, local or s3://...
    lora: {rank: 16, alpha: 32, dropout: 0.05}           # omit the section for full fine-tuning

They are typed here, beside the code that reads them, and the recipe (llm/recipe.py) validates its
`model` and `lora` sections with them, so the checks, defaults and descriptions live in one place.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tessera.llm.hf.architectures import ARCHITECTURES, architecture_named

# The Linear layers LoRA adapts by default: every projection of attention and of the MLP. For Hugging
# Face models peft's "all-linear" finds them whatever the architecture names them (the output layer is
# left out); Tessera's GPT names them as MPT does.
GPT_TARGET_MODULES = ("Wqkv", "out_proj", "up_proj", "down_proj")
HF_TARGET_MODULES = "all-linear"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PretrainedSpec(_Section):
    """A recipe's `model` section when it starts from a Hugging Face model instead of a GPT shape."""

    pretrained: str = Field(description="A transformers folder (config.json, safetensors, tokenizer files; "
                                        "local, or s3://... downloaded once per node into a cache), or a "
                                        "Tessera GPT export or checkpoint.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="The dtype the weights are loaded in (mixed precision is `precision`).")
    max_seq_len: int | None = Field(None, ge=2, description="Longest training sequence; None: the model's "
                                                             "max_position_embeddings (capped at 4096).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward (less memory).")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa", description="transformers' attention kernel.")
    cache_dir: str | None = Field(None, description="Where s3:// models are downloaded; None: "
                                                    "$TESSERA_MODEL_CACHE or ~/.cache/tessera/models.")
    allow_changed_base: bool = Field(False, description="Resume even if the base model's files differ from "
                                                        "those the checkpoint was trained on (hf/fingerprint.py).")
    random_init: bool = Field(False, description="Build the architecture from config.json with fresh random weights "
                                                 "(pre-training from scratch; LLM Foundry's pretrained: false): the "
                                                 "folder's weights are not read.")
    config_overrides: dict[str, Any] = Field(
        default_factory=dict, description="transformers config keys changed before the model is built (LLM "
                                          "Foundry's config_overrides), e.g. {n_positions: 2048}; a mapping "
                                          "updates a nested config.")
    architecture: str | None = Field(None, description="The model's shape for `--plan` when model.pretrained is "
                                                       "not a local folder: " + ", ".join(ARCHITECTURES)
                                                       + " (hf/architectures.py); training reads config.json.")

    @field_validator("pretrained")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("model.pretrained must name a folder or s3:// URL")
        return value

    @field_validator("architecture")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and architecture_named(value) is None:
            raise ValueError(f"architecture {value!r} is not one of: {', '.join(ARCHITECTURES)}")
        return value


class LoraSpec(_Section):
    """LoRA (and QLoRA) adapters: only these small matrices train; the base weights stay frozen."""

    rank: int = Field(8, ge=1, description="The adapters' rank r.")
    alpha: float = Field(16.0, gt=0, description="Scale: the update is (alpha / rank) * B @ A.")
    dropout: float = Field(0.05, ge=0.0, lt=1.0, description="Dropout on the adapters' input.")
    target_modules: list[str] | Literal["all-linear"] | None = Field(
        None, description="Linear layers to adapt, by name (q_proj, Wqkv...); None: every attention and MLP "
                          "projection of the architecture.")
    quantize_base: Literal["4bit"] | None = Field(
        None, description="4bit: QLoRA, the frozen base in NF4 via bitsandbytes (CUDA GPUs only).")

    def targets(self, hf: bool) -> list[str] | str:
        if self.target_modules is not None:
            return self.target_modules
        return HF_TARGET_MODULES if hf else list(GPT_TARGET_MODULES)

    def peft_config(self, hf: bool) -> Any:
        """The equivalent `peft.LoraConfig`."""
        import peft

        return peft.LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                               target_modules=self.targets(hf), bias="none")


def transformers_config(folder: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> Any:
    """A local folder's transformers config with `model.config_overrides` applied as LLM Foundry applies them:
    a key the config lacks is refused (ValueError naming it: a typo would otherwise change nothing), a
    mapping updates a nested config or dict."""
    from transformers import AutoConfig, PretrainedConfig

    config = AutoConfig.from_pretrained(os.fspath(folder), local_files_only=True)
    for key, value in (overrides or {}).items():
        if not hasattr(config, key):
            raise ValueError(f"model.config_overrides.{key}: {type(config).__name__} has no such key")
        current = getattr(config, key)
        if isinstance(value, dict) and isinstance(current, PretrainedConfig):
            for inner, setting in value.items():
                if not hasattr(current, inner):
                    raise ValueError(f"model.config_overrides.{key}.{inner}: {type(current).__name__} has no such key")
                setattr(current, inner, setting)
        elif isinstance(value, dict) and isinstance(current, dict):
            current.update(value)
        else:
            setattr(config, key, value)
    return config


def is_pretrained(model_section: dict[str, Any] | None) -> bool:
    """Whether a recipe's model section names a Hugging Face model (rather than a GPT shape)."""
    return isinstance(model_section, dict) and model_section.get("pretrained") is not None
