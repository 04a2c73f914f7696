"""LoRA through peft, on a Hugging Face model (`HFCausalLM`) or Tessera's GPT alike.

    add_lora(model, LoraSpec(rank=16))   # in place: base weights frozen, adapters trainable
    merge_lora(model)                    # in place: adapters folded into the weights, LoRA layers gone

The adapters are injected into the model itself (`peft.inject_adapter_in_model`), not wrapped in a
PeftModel, so the model keeps its class and the trainer's contract, and its checkpoint keys are the base
model's keys plus the adapters'. Only the adapters require gradients, which is what makes the
checkpoint hold only them and their optimizer state (the model says so with `checkpoint_trainable_only`,
which train/checkpoint/state.py reads).
"""

from __future__ import annotations

from torch import nn

from tessera.llm.hf.adapter import HFCausalLM
from tessera.llm.hf.config import LoraSpec


def lora_target(model: nn.Module) -> tuple[nn.Module, bool]:
    """The module LoRA is injected into (the transformers model inside an adapter) and whether it is HF."""
    if isinstance(model, HFCausalLM):
        return model.hf, True
    return model, False


def add_lora(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """Freeze `model`'s weights and add trainable LoRA adapters to the spec's target modules."""
    import peft

    target, hf = lora_target(model)
    for param in model.parameters():
        param.requires_grad_(False)
    try:
        peft.inject_adapter_in_model(spec.peft_config(hf), target)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"lora.target_modules: {exc}") from None
    model.checkpoint_trainable_only = True  # the base is rebuilt from its source (train/checkpoint/state.py)
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRA adapter into its base layer's weight and put the plain layer back."""
    from peft.tuners.lora import LoraLayer

    for name, module in list(model.named_modules()):
        if not isinstance(module, LoraLayer):
            continue
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
    for module in model.modules():  # peft's marker: transformers would save only adapters while it is there
        if "peft_config" in vars(module):
            del module.peft_config
    model.checkpoint_trainable_only = False
    for param in model.parameters():
        param.requires_grad_(True)
    return model


def has_lora(model: nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return any(isinstance(m, LoraLayer) for m in model.modules())
