"""`tessera train RECIPE --plan`: what a recipe will need and reach on a GPU type, without a GPU.

The recipe's model is built on the meta device (no memory, milliseconds even for 7B), so the parameter
count is the model's own (Tessera's GPT, or transformers' model class for a pretrained one, LoRA adapters
added as training adds them), not a formula restated here; `tessera.train.plan` turns the counts into
memory per device and throughput for the recipe's parallelism. Values a recipe leaves for the user
(`???`: buckets, data, model.pretrained) are not needed for a plan, so they are filled with placeholders
instead of refused.

A pretrained model's shape comes from its config.json when `model.pretrained` is a local folder, else
(a bucket, a hub id, unset) from the table of well-known architectures (llm/hf/architectures.py), named
by `model.architecture` or by the last part of `model.pretrained`: nothing is downloaded. A LoRA plan
counts the frozen weights in the dtype they are loaded in (`model.dtype`) and gradients and AdamW state
for the adapters only.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tessera.llm.hf.architectures import ARCHITECTURES, architecture_config, architecture_named
from tessera.llm.hf.config import LoraSpec, PretrainedSpec, is_pretrained
from tessera.llm.hf.lora import add_lora
from tessera.llm.model import GPT, GPTConfig, training_flops_per_token
from tessera.llm.model_source import is_hub_id, is_remote, resolve_model_source
from tessera.llm.recipe import Recipe, RecipeError, load_recipe_leaving_unset
from tessera.llm.recipe_required import UNSET_MODEL
from tessera.train.hardware import Accelerator
from tessera.train.parallel import resolve_plan
from tessera.train.plan import GB, USABLE_FRACTION, Layout, ModelCounts, Plan, make_plan, weight_bytes
from tessera.train.time import TimeUnit

KEY = "model.pretrained"
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def load_for_plan(path: str, overrides: list[str]) -> Recipe:
    """The recipe with its `???` values (buckets, data, model.pretrained) set to placeholders a plan never opens."""
    return load_recipe_leaving_unset(path, overrides)[0]


def model_counts(recipe: Recipe) -> ModelCounts:
    """Counts from the recipe's model built on the meta device (LoRA adapters included)."""
    if not is_pretrained(recipe.model):
        return _gpt_counts(recipe.gpt_config(), recipe.lora)
    spec = PretrainedSpec.model_validate(recipe.model)
    fixed = 0 if recipe.precision.value == "pure_bf16" else _DTYPE_BYTES[spec.dtype]  # pure_bf16 casts to bf16
    shape = pretrained_shape(spec)
    if isinstance(shape, GPTConfig):  # a Tessera export or checkpoint as the base
        return _gpt_counts(replace(shape, max_seq_len=spec.max_seq_len or shape.max_seq_len), recipe.lora, fixed)
    from transformers import AutoModelForCausalLM

    from tessera.llm.hf.adapter import HFCausalLM

    with torch.device("meta"):
        model = HFCausalLM(AutoModelForCausalLM.from_config(shape), spec.max_seq_len)
        if recipe.lora is not None:
            add_lora(model, recipe.lora)
    return _counts(model, model.blocks(), shape.num_hidden_layers, shape.hidden_size, shape.vocab_size,
                   model.max_seq_len, fixed)


def _gpt_counts(cfg: GPTConfig, lora: LoraSpec | None, fixed_bytes: int = 0) -> ModelCounts:
    with torch.device("meta"):
        model: Any = GPT(cfg)
        if lora is not None:
            model = add_lora(model, lora)
    return _counts(model, list(model.transformer.blocks), cfg.n_layers, cfg.d_model, cfg.vocab_size,
                   cfg.max_seq_len, fixed_bytes)


def _counts(model: nn.Module, blocks: list[nn.Module], n_layers: int, d_model: int, vocab_size: int,
            seq_len: int, fixed_bytes: int) -> ModelCounts:
    params = sum(p.numel() for p in model.parameters())  # a tied embedding once
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return ModelCounts(params=params, trainable=trainable, n_layers=n_layers, d_model=d_model,
                       vocab_size=vocab_size, seq_len=seq_len,
                       flops_per_token=training_flops_per_token(params, n_layers, d_model, seq_len,
                                                                frozen=params - trainable),
                       block_params=sum(p.numel() for p in blocks[0].parameters()), weight_bytes=fixed_bytes)


def shape_origin(spec: PretrainedSpec) -> str | None:
    """Where a plan reads the pretrained model's shape: None for the local folder's own config.json, else
    the table's name (model.architecture, else model.pretrained's last part); RecipeError when neither."""
    url = spec.pretrained
    if not is_remote(url) and Path(url.removeprefix("file://")).expanduser().exists():
        return None
    name = architecture_named(spec.architecture or url.rstrip("/").rsplit("/", 1)[-1])
    if name is not None:
        return name
    if url == UNSET_MODEL:
        why = f"{KEY} is unset (???)"
    elif is_remote(url):
        why = f"{KEY}={url} is not read by --plan (nothing is downloaded)"
    elif is_hub_id(url):
        why = f"model '{url}' is not on this machine"
    else:
        why = f"{KEY}={url}: no such folder"
    raise RecipeError(f"--plan needs the model's shape: {why}; set {KEY} to a local folder with config.json, "
                      f"or model.architecture to one of: {', '.join(ARCHITECTURES)}")


def pretrained_shape(spec: PretrainedSpec) -> Any:
    """A transformers config (or a Tessera GPTConfig) of the pretrained model, as `shape_origin` says."""
    from transformers import AutoConfig

    name = shape_origin(spec)
    if name is not None:
        values = architecture_config(name)
        return AutoConfig.for_model(values.pop("model_type"), **values)
    source = resolve_model_source(spec.pretrained, KEY)
    if source.kind == "transformers":
        folder = Path(spec.pretrained.removeprefix("file://")).expanduser()
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    from tessera.llm.hf.load import tessera_gpt_description

    return tessera_gpt_description(spec)[0]


def recipe_layout(recipe: Recipe, world_size: int, gpus_per_node: int) -> Layout:
    """The Layout of the recipe's `parallelism` section resolved for `world_size` devices, `gpus_per_node`
    per node, by the same `resolve_plan` the Trainer uses (so a plan and a run agree on shard degrees)."""
    plan = resolve_plan(recipe.parallelism, world_size, min(gpus_per_node, world_size), "cuda",
                        recipe.precision.value)
    if plan.sharding == "hybrid":
        shard = plan.mesh_shape[plan.mesh_dims.index("dp_shard")]
    else:
        shard = plan.dp_degree if plan.sharding in ("full_shard", "shard_grad_op") else 1
    ac = plan.activation_checkpointing
    if ac == "none" and _ac(recipe):
        ac = "full"
    return Layout(world_size, plan.sharding, shard, plan.tp_degree, recipe.precision.value, ac,  # type: ignore[arg-type]
                  plan.checkpoint_every, plan.param_dtype)


def _ac(recipe: Recipe) -> bool:
    """A pretrained model's own switch (model.gradient_checkpointing) counts as full checkpointing."""
    return bool(recipe.model.get("gradient_checkpointing") or recipe.model.get("activation_checkpointing"))


def plan_recipe(recipe: Recipe, device: Accelerator, nodes: int = 1, gpus_per_node: int | None = None,
                efficiency: float | None = None, activation_checkpointing: bool | str | None = None) -> Plan:
    per_node = gpus_per_node or device.gpus_per_node
    world = nodes * per_node
    layout = recipe_layout(recipe, world, per_node)
    if activation_checkpointing is not None:
        layout = layout.with_ac(activation_checkpointing)
    per_device = recipe.check_batches(world // layout.tp_degree)
    mb = recipe.device_train_microbatch_size
    kwargs = {"efficiency": efficiency} if efficiency is not None else {}
    counts = model_counts(recipe)
    plan = make_plan(counts, layout, device, per_device, mb if isinstance(mb, int) else None, **kwargs)
    if mb == "auto" and not plan.fits and plan.largest_microbatch:  # where auto-microbatching would settle
        plan = make_plan(counts, layout, device, per_device, plan.largest_microbatch, **kwargs)
    return plan


def plan_dict(plan: Plan, recipe: Recipe) -> dict[str, Any]:
    c, lay = plan.counts, plan.layout
    return {"gpu": plan.device.name, "devices": lay.world_size, "sharding": lay.sharding,
            "shard_degree": lay.shard_degree, "tp_degree": lay.tp_degree, "precision": lay.precision,
            "activation_checkpointing": lay.ac_mode, "params": c.params, "trainable": c.trainable,
            "flops_per_token": c.flops_per_token, "microbatch": plan.microbatch,
            "memory_gb": plan.memory.gb(), "memory_gb_other_ac": plan.memory_other_ac.gb(),
            "usable_gb": plan.device.memory_gb * USABLE_FRACTION, "fits": plan.fits,
            "largest_microbatch": plan.largest_microbatch, "assumed_efficiency": plan.efficiency,
            "tokens_per_sec_per_device": plan.tokens_per_sec_per_device, "tokens_per_sec": plan.tokens_per_sec,
            "mfu": plan.mfu, "step_seconds": _step_seconds(plan, recipe), "warnings": plan.warnings}


def _step_seconds(plan: Plan, recipe: Recipe) -> float | None:
    total = plan.tokens_per_sec
    return None if not total else recipe.global_train_batch_size * plan.counts.seq_len / total


def render(plan: Plan, recipe: Recipe, name: str) -> str:
    """The plan as the lines `tessera train --plan` prints."""
    c, lay, dev = plan.counts, plan.layout, plan.device
    shard = {"ddp": "replicated (DDP)", "none": "one device", "full_shard": f"FSDP full_shard over {lay.shard_degree}",
             "shard_grad_op": f"FSDP shard_grad_op over {lay.shard_degree}",
             "hybrid": f"HSDP: sharded over {lay.shard_degree}, replicated across groups"}[lay.sharding]
    tp = f", tensor parallel {lay.tp_degree}" if lay.tp_degree > 1 else ""
    lines = [f"plan: {name} on {lay.world_size} x {dev.name}; {shard}{tp}; {lay.precision}",
             f"model: {c.params / 1e9:.3f}B parameters ({c.trainable / 1e9:.3f}B trainable), {c.n_layers} layers, "
             f"d_model {c.d_model}, vocab {c.vocab_size}, sequence {c.seq_len}{_origin(recipe)}",
             f"FLOPs per token (training: 6 per trainable, 4 per frozen parameter, + attention): "
             f"{c.flops_per_token:.3e}"]
    ac_now = f"AC {lay.ac_mode}"
    ac_other = "AC none" if lay.ac_mode != "none" else "AC full"
    title = f"memory per GPU (GB), microbatch {plan.microbatch}:"
    lines.append(f"{title:<37}{ac_now:>11}  {ac_other:>11}")
    now, other = plan.memory.gb(), plan.memory_other_ac.gb()
    stored = {4: "fp32", 2: "16-bit"}[weight_bytes(c, lay)]
    for key, label in (("weights", f"weights ({stored})"), ("working_copies", "working copies (compute dtype)"),
                       ("gradients", "gradients"), ("optimizer", "optimizer state (AdamW)"),
                       ("activations", "activations"), ("total", "total")):
        lines.append(f"  {label:<34} {now[key]:>11.2f}  {other[key]:>11.2f}")
    usable = f"usable on {dev.name} ({USABLE_FRACTION:.0%} of {dev.memory_gb:g} GB)"
    lines.append(f"  {usable:<34} {dev.memory_gb * USABLE_FRACTION:>11.2f}")
    mb = recipe.device_train_microbatch_size
    if not isinstance(mb, int):
        fit = plan.largest_microbatch or "none"
        lines.append(f"device_train_microbatch_size={mb}: the largest power-of-two microbatch that fits is {fit}"
                     + (" (shown above)" if mb == "auto" and fit == plan.microbatch else ""))
    if plan.tokens_per_sec_per_device is not None:
        lines.append(f"throughput at an assumed {plan.efficiency:.0%} hardware FLOPs utilisation "
                     f"(--efficiency): {plan.tokens_per_sec_per_device:,.0f} tokens/s per GPU, "
                     f"{plan.tokens_per_sec:,.0f} tokens/s in all, expected MFU {plan.mfu:.1%}"
                     + (" (recomputation is not model FLOPs)" if lay.ac_mode != "none" else ""))
        step = _step_seconds(plan, recipe)
        lines.append(f"step: {recipe.global_train_batch_size} x {c.seq_len} tokens in ~{step:.2f} s"
                     + _duration(recipe, step, lay.world_size, c.seq_len))
    else:
        lines.append(f"throughput: no {lay.precision} peak for {dev.name} in tessera.train.hardware")
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def _origin(recipe: Recipe) -> str:
    """Where a pretrained model's shape was read: its config.json, or the architecture table."""
    if not is_pretrained(recipe.model):
        return ""
    spec = PretrainedSpec.model_validate(recipe.model)
    name = shape_origin(spec)
    return f"; from {spec.pretrained}" if name is None else f"; the {name} architecture (llm/hf/architectures.py)"


def _duration(recipe: Recipe, step: float | None, devices: int, seq_len: int) -> str:
    if not step:
        return ""
    unit, value = recipe.max_duration.unit, recipe.max_duration.value
    steps = {TimeUnit.BATCH: value, TimeUnit.TOKEN: value / (recipe.global_train_batch_size * seq_len),
             TimeUnit.SAMPLE: value / recipe.global_train_batch_size}.get(unit)
    if steps is None:
        return f"; max_duration {recipe.max_duration}: the epoch length depends on the data"
    hours = steps * step / 3600
    return f"; max_duration {recipe.max_duration}: ~{hours:,.1f} h, {hours * devices:,.0f} GPU-hours"


__all__ = ["GB", "load_for_plan", "model_counts", "plan_dict", "plan_recipe", "pretrained_shape", "recipe_layout",
           "render", "shape_origin"]
