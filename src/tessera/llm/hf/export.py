"""A training checkpoint to the transformers format, in a folder or a bucket.

    export_hf("runs/r1/checkpoints", "out/model")                       # merged: AutoModelForCausalLM loads it
    export_hf("runs/r1/checkpoints", "s3://b/adapter", adapter_only=True)  # PeftModel.from_pretrained(base, ...)

The model is rebuilt as the run built it (the pretrained folder of `model.pretrained`, or a GPT from the
run's seed), LoRA layers added with the run's `lora` settings, and the checkpoint loaded on top, so a
LoRA checkpoint, which holds only the adapters, exports whole. Merged exports fold the adapters into the
weights; a Tessera GPT is written as the transformers architecture with the same maths (gpt_to_hf.py).
An adapter-only export is peft's layout (adapter_config.json + adapter_model.safetensors) for the base
the run started from. Files are written to a local folder first and then uploaded, the config last, so
a folder with a config is complete.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from tessera.llm.export import (
    ExportError,
    checkpoint_weights,
    load_model,
    model_config_from_run,
    tokenizer_from_run,
    upload_files,
)
from tessera.llm.hf.adapter import HFCausalLM
from tessera.llm.hf.config import LoraSpec, PretrainedSpec, is_pretrained
from tessera.llm.hf.fingerprint import FINGERPRINT_KEY, check_base
from tessera.llm.hf.gpt_to_hf import gpt_to_hf, hf_architecture
from tessera.llm.hf.load import load_pretrained_model
from tessera.llm.hf.lora import add_lora, lora_target, merge_lora
from tessera.llm.hf.mpt_load import load_gpt
from tessera.llm.model import GPT
from tessera.llm.model_source import resolve_model_source
from tessera.storage import open_store
from tessera.train.checkpoint import apply_state
from tessera.train.trainer import seed_all

LAST = ("config.json", "adapter_config.json")  # uploaded after everything else


def rebuild(path: str | os.PathLike[str], state: dict[str, Any] | None = None, base_check: str | None = None,
            ) -> tuple[nn.Module, Any, LoraSpec | None, dict[str, Any]]:
    """(model with the checkpoint's weights, tokenizer, the run's LoRA spec, run config) of a checkpoint
    (`state`: its weights-only state, if already read). With `base_check` (how to override, for the
    message), a base model whose files differ from the fingerprint the run recorded is refused."""
    state = state if state is not None else checkpoint_weights(path)
    config = state.get("config") or {}
    lora = LoraSpec.model_validate({**config["lora"], "quantize_base": None}) if config.get("lora") else None
    if is_pretrained(config.get("model")):
        keys = {k: v for k, v in config["model"].items() if k in PretrainedSpec.model_fields}
        spec = PretrainedSpec.model_validate({**keys, "gradient_checkpointing": False})
        if base_check is not None:
            check_base(config.get(FINGERPRINT_KEY), spec, os.fspath(path), base_check)
        model, tokenizer = load_pretrained_model(spec, lora)
        if tokenizer is None:
            tokenizer = tokenizer_from_run(config)
    else:
        seed_all(int((config.get("recipe") or {}).get("seed", 0)))  # the frozen base as the run drew it
        model = GPT(model_config_from_run(config))
        if lora is not None:
            add_lora(model, lora)
        tokenizer = tokenizer_from_run(config)
    try:
        apply_state({"model": state["model"]}, model)
    except (RuntimeError, ValueError) as exc:
        raise ExportError(f"{path}: the checkpoint does not fit the model its run config describes: {exc}") from None
    return model.eval(), tokenizer, lora, config


def load_checkpoint_model(path: str | os.PathLike[str], base_check: str | None = None) -> tuple[nn.Module, Any]:
    """Any model, for inference: a transformers folder, an export folder, or a checkpoint of any run (a
    GPT, a pretrained model, LoRA merged into its weights), as `resolve_model_source` tells them apart. A
    transformers folder or a checkpoint of a pretrained model gives an `HFCausalLM` (logits from
    `model(ids)`) and its transformers tokenizer. `base_check`: as `rebuild`."""
    kind = resolve_model_source(path).kind
    if kind == "transformers":
        return load_pretrained_model(PretrainedSpec(pretrained=os.fspath(path)))
    if kind == "export":
        return load_model(path)
    if kind == "composer":
        return load_gpt(path)
    state = checkpoint_weights(path)
    config = state.get("config") or {}
    if not (is_pretrained(config.get("model")) or config.get("lora")):
        return load_model(path)
    model, tokenizer, lora, _ = rebuild(path, state, base_check)
    return (merge_lora(model) if lora is not None else model).eval(), tokenizer


def hf_tokenizer(tokenizer: Any) -> Any:
    """A transformers tokenizer for the export: the model's own, or a Tessera BPE wrapped; None for bytes."""
    if tokenizer is None or hasattr(tokenizer, "save_pretrained"):
        return tokenizer
    inner = getattr(tokenizer, "_tok", None)
    if inner is None:
        return None  # the byte tokenizer has no transformers form
    from transformers import PreTrainedTokenizerFast

    eos = inner.id_to_token(tokenizer.eos_id)
    return PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=eos, bos_token=eos)


def export_hf(path: str | os.PathLike[str], out: str | os.PathLike[str], *, adapter_only: bool = False,
              tokenizer: Any = None, allow_changed_base: bool = False) -> str:
    """Write the checkpoint (or Tessera export) at `path` to `out` in the transformers layout, or with
    `adapter_only` a LoRA run's adapter in peft's. A base model (`model.pretrained`) whose files changed
    since the run recorded their fingerprint is refused (`BaseModelChanged`) unless `allow_changed_base`."""
    base_check = None if allow_changed_base else "pass --allow-changed-base"
    with tempfile.TemporaryDirectory(prefix="tessera-hf-export-") as tmp:
        folder = Path(tmp)
        if adapter_only:
            model, own_tokenizer, lora, config = rebuild(path, base_check=base_check)
            save_adapter(model, lora, config, folder)
        else:
            model, own_tokenizer = load_checkpoint_model(path, base_check)  # LoRA merged
            hf = model.hf if isinstance(model, HFCausalLM) else gpt_to_hf(model)
            hf.save_pretrained(folder, safe_serialization=True)
        tok = hf_tokenizer(tokenizer if tokenizer is not None else own_tokenizer)
        if tok is not None:
            tok.save_pretrained(folder)
        return upload_folder(folder, out)


def save_adapter(model: nn.Module, lora: LoraSpec | None, config: dict[str, Any], folder: Path) -> None:
    """peft's adapter files for the run's base model."""
    import peft
    from safetensors.torch import save_file

    if lora is None:
        raise ExportError("--adapter-only: this run has no lora section (it fine-tuned every weight); "
                          "export the whole model instead")
    target, hf = lora_target(model)
    if not hf and hf_architecture(model.cfg) != "mpt":
        raise ExportError("--adapter-only: a GPT adapter maps onto transformers' MPT only (model.attn='alibi'); "
                          "export the merged model instead")
    weights = peft.get_peft_model_state_dict(target)
    save_file({f"base_model.model.{k}": v.detach().contiguous() for k, v in weights.items()},
              folder / "adapter_model.safetensors")
    peft_config = target.peft_config["default"]
    peft_config.task_type = "CAUSAL_LM"
    model_section = config.get("model") or {}
    peft_config.base_model_name_or_path = model_section.get("pretrained") if hf else None
    peft_config.save_pretrained(folder)


def upload_folder(folder: Path, out: str | os.PathLike[str]) -> str:
    """Every file of `folder` to `out` (a folder or bucket URL), the config files last; returns the URL."""
    store = open_store(os.fspath(out))
    files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: (p.name in LAST, str(p)))
    upload_files(store, [(file.relative_to(folder).as_posix(), file) for file in files])
    return store.url
