"""Load a Hugging Face model folder (local or s3://) as a trainer-ready model, with its tokenizer.

    model, tokenizer = load_hf(PretrainedSpec(pretrained="s3://bucket/models/llama"), lora=LoraSpec())
    model, tokenizer = load_pretrained_model(spec, lora)   # a transformers folder, or Tessera's own GPT

`model.pretrained` may also name a Tessera GPT (an export folder of `tessera llm export`, or a training
checkpoint): then the GPT is loaded with its weights and LoRA, if asked, is added to it. Which of them a
path is, is decided once, by `resolve_model_source` (llm/model_source.py; a hub id is refused there).

transformers reads local files only (`local_files_only=True`): a remote folder is first copied to the
node's cache (hf/cache.py). With a `lora` spec the base weights are frozen and LoRA layers are added
(hf/lora.py); `quantize_base: 4bit` loads the base in NF4 through bitsandbytes, on CUDA only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from tessera.llm.export import ExportError
from tessera.llm.hf.adapter import HFCausalLM, default_seq_len
from tessera.llm.hf.cache import local_model_folder
from tessera.llm.hf.config import LoraSpec, PretrainedSpec, transformers_config
from tessera.llm.hf.lora import add_lora
from tessera.llm.model_source import not_a_model, resolve_model_source

KEY = "model.pretrained"  # the recipe key errors name


class QuantizationUnavailable(ValueError):
    """QLoRA was asked for where it cannot run (no CUDA GPU, or bitsandbytes missing)."""


def quantization_config(lora: LoraSpec | None) -> Any:
    """transformers' BitsAndBytesConfig for `lora.quantize_base`, None without it; a one-line error on CPU."""
    if lora is None or lora.quantize_base is None:
        return None
    if not torch.cuda.is_available():
        raise QuantizationUnavailable("lora.quantize_base: 4bit (QLoRA) needs a CUDA GPU and bitsandbytes; "
                                      "this machine has no GPU: remove the key to train LoRA on full weights")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise QuantizationUnavailable("lora.quantize_base: 4bit (QLoRA) needs bitsandbytes: "
                                      "pip install bitsandbytes") from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def dtype_keyword() -> str:
    """transformers 4.56 renamed `torch_dtype` to `dtype` (and warns on the old name)."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def load_hf_model(folder: str | Path, dtype: str = "float32", attn_implementation: str | None = "sdpa",
                  quantization: Any = None, config_overrides: dict[str, Any] | None = None,
                  random_init: bool = False) -> Any:
    """A transformers causal LM from a local folder, never from a hub; with `random_init`, the folder's
    architecture (config.json, after `config_overrides`) with fresh weights."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {dtype_keyword(): getattr(torch, dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    config = transformers_config(folder, config_overrides)
    if random_init:
        return AutoModelForCausalLM.from_config(config, **kwargs)
    if quantization is not None:  # a 4-bit model is placed on its GPU as it loads; it is not moved later
        from tessera.train.distributed import current_env

        kwargs["quantization_config"] = quantization
        kwargs["device_map"] = {"": current_env().local_rank % max(torch.cuda.device_count(), 1)}
    return AutoModelForCausalLM.from_pretrained(str(folder), config=config, local_files_only=True, **kwargs)


def load_hf_tokenizer(folder: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_hf(spec: PretrainedSpec, lora: LoraSpec | None = None) -> tuple[HFCausalLM, Any]:
    """The recipe's pretrained model as an `HFCausalLM` (LoRA added when `lora` is given) and its tokenizer."""
    quantization = quantization_config(lora)  # fails before any download on a machine that cannot run it
    folder = local_model_folder(spec.pretrained, spec.cache_dir)
    hf = load_hf_model(folder, spec.dtype, spec.attn_implementation, quantization, spec.config_overrides,
                       spec.random_init)
    if quantization is not None:
        import peft

        hf = peft.prepare_model_for_kbit_training(hf, use_gradient_checkpointing=spec.gradient_checkpointing)
    elif spec.gradient_checkpointing:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tokenizer = load_hf_tokenizer(folder)
    rows = hf.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:  # ids past the embedding would fail deep inside the first forward
        raise ValueError(f"model.pretrained={spec.pretrained}: the tokenizer has {len(tokenizer)} tokens but the "
                         f"model's embedding only {rows} rows (resize it with transformers before fine-tuning)")
    positions = getattr(hf.config, "max_position_embeddings", None)
    if spec.max_seq_len and positions and spec.max_seq_len > positions:  # a position table would be indexed past
        raise ValueError(f"model.max_seq_len={spec.max_seq_len} is longer than {spec.pretrained}'s {positions} "
                         "positions (max_position_embeddings); train shorter sequences")
    model = HFCausalLM(hf, spec.max_seq_len)
    if lora is not None:
        add_lora(model, lora)
    return model, tokenizer


def load_tessera_gpt(spec: PretrainedSpec, lora: LoraSpec | None = None) -> tuple[nn.Module, Any]:
    """A Tessera GPT export or checkpoint, or a Composer checkpoint of an MPT, as the starting point (its
    tokenizer, None if it has none)."""
    from tessera.llm.hf.mpt_load import load_gpt

    try:
        model, tokenizer = load_gpt(spec.pretrained)
    except ExportError:
        raise not_a_model(spec.pretrained, KEY) from None
    if spec.max_seq_len and spec.max_seq_len > model.cfg.max_seq_len:
        raise ValueError(f"model.max_seq_len={spec.max_seq_len} is longer than {spec.pretrained}'s "
                         f"{model.cfg.max_seq_len} positions")
    model = model.to(getattr(torch, spec.dtype)).train()
    return (add_lora(model, lora) if lora is not None else model), tokenizer


def tessera_gpt_description(spec: PretrainedSpec) -> tuple[Any, Any]:
    """(GPTConfig, tokenizer) of a Tessera GPT source: an export's from its config alone, a checkpoint's
    by loading it."""
    from tessera.llm.export import describe_export

    if resolve_model_source(spec.pretrained, KEY).kind == "composer":  # one file: its config is inside
        from tessera.llm.hf.mpt_load import describe_composer

        return describe_composer(spec.pretrained)
    try:
        described = describe_export(spec.pretrained)
    except ExportError:
        raise not_a_model(spec.pretrained, KEY) from None
    if described is not None:
        return described
    model, tokenizer = load_tessera_gpt(spec)
    return model.cfg, tokenizer


def is_transformers(spec: PretrainedSpec) -> bool:
    """Whether `model.pretrained` is a transformers folder (else a Tessera export or checkpoint)."""
    return resolve_model_source(spec.pretrained, KEY).kind == "transformers"


def load_pretrained_model(spec: PretrainedSpec, lora: LoraSpec | None = None) -> tuple[nn.Module, Any]:
    """The model `model.pretrained` names: a transformers folder (HFCausalLM) or a Tessera GPT."""
    if is_transformers(spec):
        return load_hf(spec, lora)
    return load_tessera_gpt(spec, lora)


def pretrained_seq_len(spec: PretrainedSpec) -> int:
    """`spec.max_seq_len`, else the model's max_position_embeddings capped at 4096 (from config.json)."""
    if spec.max_seq_len:
        return spec.max_seq_len
    if not is_transformers(spec):
        return tessera_gpt_description(spec)[0].max_seq_len
    return default_seq_len(transformers_config(local_model_folder(spec.pretrained, spec.cache_dir),
                                               spec.config_overrides))


def pretrained_tokenizer(spec: PretrainedSpec) -> Any:
    """The tokenizer saved with the pretrained model (a transformers one with its chat template, or a
    Tessera GPT's); None when a Tessera model was saved without one."""
    if not is_transformers(spec):
        return tessera_gpt_description(spec)[1]
    return load_hf_tokenizer(local_model_folder(spec.pretrained, spec.cache_dir))
