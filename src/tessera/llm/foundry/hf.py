"""LLM Foundry's `hf_causal_lm` as the recipe's `model.pretrained` section (llm/hf/config.py), and its
`peft_config` as the recipe's `lora` section.

    model: {name: hf_causal_lm, pretrained_model_name_or_path: ./gpt2, pretrained: false,
            config_overrides: {n_positions: 2048}, peft_config: {peft_type: LORA, r: 16, lora_alpha: 32}}
    -> model: {pretrained: ./gpt2, random_init: true, config_overrides: {n_positions: 2048}, ...}
       lora: {rank: 16, alpha: 32, dropout: 0.0, target_modules: [c_attn]}

The model is built by transformers from the folder, as Foundry builds it, so any decoder-only
architecture transformers has trains (GPT-2, GPT-Neo, OPT, Llama, MPT, Mixtral...). An encoder-decoder
(hf_t5, or a config.json with is_encoder_decoder) is refused: Tessera trains causal LMs only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tessera.llm.foundry.errors import FoundryError, refuse, section, unknown, warn
from tessera.llm.foundry.paths import model_path
from tessera.llm.hf.config import transformers_config
from tessera.llm.model_source import is_remote

_HF_KEYS = {"name", "pretrained_model_name_or_path", "pretrained", "pretrained_lora_id_or_path", "trust_remote_code",
            "use_auth_token", "use_flash_attention_2", "attn_implementation", "load_in_8bit", "init_device",
            "config_overrides", "use_logits", "shift_labels", "peft_config", "allow_embedding_resizing",
            "use_train_metrics", "additional_train_metrics", "additional_eval_metrics", "should_save_peft_only",
            "master_weights_dtype"}
_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
           "amp_bf16": "bfloat16", "fp16": "float16", "float16": "float16", "amp_fp16": "float16"}
# peft.LoraConfig's keys that Tessera's LoRA has (the rest must keep peft's defaults).
_PEFT_KEYS = {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora",
              "use_dora", "modules_to_save", "fan_in_fan_out", "init_lora_weights", "inference_mode"}
KEY = "model.pretrained_model_name_or_path"


def hf_model(model: dict[str, Any], max_seq_len: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the recipe's model section, its lora section or None) for a Foundry `hf_causal_lm` section."""
    unknown("model", model, _HF_KEYS)
    path = model_path(model.get("pretrained_model_name_or_path"), KEY)
    config = _config_json(path)
    if config.get("is_encoder_decoder"):
        raise refuse(KEY, f"an encoder-decoder model ({config.get('model_type')}): Tessera trains decoder-only "
                          "causal language models", path)
    out: dict[str, Any] = {"pretrained": path, "max_seq_len": max_seq_len}
    if model.get("pretrained", True) is False:
        out["random_init"] = True
    if overrides := section(model.get("config_overrides"), "model.config_overrides"):
        _check_overrides(path, overrides)
        out["config_overrides"] = overrides
    attention = "flash_attention_2" if model.get("use_flash_attention_2") else model.get("attn_implementation")
    if attention == "flash_attention_2":
        warn("model.use_flash_attention_2: Tessera loads the model with attn_implementation=sdpa (the same maths; "
             "torch picks a flash kernel where the GPU has one)")
    elif attention not in (None, "sdpa", "eager"):
        raise refuse("model.attn_implementation", "not one of eager, sdpa, flash_attention_2", attention)
    if attention == "eager":
        out["attn_implementation"] = "eager"
    if model.get("master_weights_dtype") is not None:
        dtype = model["master_weights_dtype"]
        if dtype not in _DTYPES:
            raise refuse("model.master_weights_dtype", f"not one of {', '.join(_DTYPES)}", dtype)
        out["dtype"] = _DTYPES[dtype]
    for key, allowed in (("load_in_8bit", False), ("pretrained_lora_id_or_path", None),
                         ("allow_embedding_resizing", False)):
        if model.get(key, allowed) != allowed:
            raise refuse(f"model.{key}", "not supported when training with Tessera", model[key])
    peft = section(model.get("peft_config"), "model.peft_config")
    return out, (_lora(peft, config) if peft else None)


def _check_overrides(path: str, overrides: dict[str, Any]) -> None:
    """config_overrides on keys the model's config lacks are refused now, as Foundry refuses them when it
    builds the model (a local folder; a bucket's config is read when the run starts)."""
    if is_remote(path) or not (Path(path) / "config.json").is_file():
        return
    try:
        transformers_config(path, overrides)
    except ValueError as exc:
        if str(exc).startswith("model.config_overrides"):
            raise FoundryError(str(exc)) from None


def _config_json(path: str) -> dict[str, Any]:
    """The folder's config.json (local only: a bucket's is read when the run starts), {} without one."""
    if is_remote(path):
        return {}
    file = Path(path.removeprefix("file://")).expanduser() / "config.json"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _lora(peft: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """peft's LoraConfig keys as the recipe's lora section, with peft's defaults where Foundry leaves them."""
    unknown("model.peft_config", peft, _PEFT_KEYS)
    if str(peft.get("peft_type", "LORA")).upper() != "LORA":
        raise refuse("model.peft_config.peft_type", "only LoRA adapters are implemented", peft["peft_type"])
    if str(peft.get("task_type", "CAUSAL_LM")).upper() != "CAUSAL_LM":
        raise refuse("model.peft_config.task_type", "Tessera trains causal language models", peft["task_type"])
    for key, default in (("bias", "none"), ("use_rslora", False), ("use_dora", False), ("modules_to_save", None),
                         ("fan_in_fan_out", False), ("init_lora_weights", True)):
        if peft.get(key, default) != default:
            raise refuse(f"model.peft_config.{key}", "not implemented in Tessera's LoRA", peft[key])
    targets = peft.get("target_modules")
    if targets is None:  # peft's default for the architecture, as peft itself would pick it
        targets = _peft_default_targets(config.get("model_type"))
    elif isinstance(targets, str) and targets != "all-linear":
        targets = [targets]
    return {"rank": peft.get("r", 8), "alpha": peft.get("lora_alpha", 8), "dropout": peft.get("lora_dropout", 0.0),
            "target_modules": targets}


def _peft_default_targets(model_type: str | None) -> list[str]:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    if model_type not in DEFAULTS:
        raise refuse("model.peft_config.target_modules", "must be set: peft has no default for this model "
                                                          f"({model_type or 'its config.json is not readable here'})")
    return list(DEFAULTS[model_type])
