"""`tessera train RECIPE --plan`: what a recipe will need and reach on a GPU type, without a GPU.

The recipe's model is built on the meta device (no memory, milliseconds even for 7B), so the parameter
count and FLOPs per token are the model's own (`num_params`, `flops_per_token`), not a formula restated
here; `tessera.train.plan` turns them into memory per device and throughput for the recipe's
parallelism. Values a recipe leaves for the user (`???`: buckets, data paths) are not needed for a plan,
so they are filled with placeholders instead of refused.
"""

from __future__ import annotations

from typing import Any

import torch

from tessera.llm.hf.config import is_pretrained
from tessera.llm.model import GPT
from tessera.llm.recipe import Recipe, RecipeError, load_recipe_leaving_unset
from tessera.train.hardware import Accelerator
from tessera.train.parallel import resolve_plan
from tessera.train.plan import GB, USABLE_FRACTION, Layout, ModelCounts, Plan, make_plan
from tessera.train.time import TimeUnit


def load_for_plan(path: str, overrides: list[str]) -> Recipe:
    """The recipe with its `???` values (buckets, data) set to placeholders a plan never opens."""
    return load_recipe_leaving_unset(path, overrides, model_unset=(
        "--plan needs the model: set model.pretrained (a local folder with config.json) or use a recipe with "
        "model.name"))[0]


def model_counts(recipe: Recipe) -> ModelCounts:
    """Counts from the recipe's model built on the meta device (LoRA adapters included)."""
    if is_pretrained(recipe.model):
        raise RecipeError("--plan covers recipes with a GPT shape (model.name ...); for a pretrained model, plan "
                          "with the GPT of the same shape (model.name=... model.d_model=...)")
    cfg = recipe.gpt_config()
    with torch.device("meta"):
        model: Any = GPT(cfg)
        if recipe.lora is not None:
            from tessera.llm.hf.lora import add_lora

            model = add_lora(model, recipe.lora)
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    blocks = model.transformer.blocks
    return ModelCounts(params=params, trainable=trainable, n_layers=cfg.n_layers, d_model=cfg.d_model,
                       vocab_size=cfg.vocab_size, seq_len=cfg.max_seq_len, flops_per_token=model.flops_per_token(),
                       block_params=sum(p.numel() for p in blocks[0].parameters()))


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
             f"d_model {c.d_model}, vocab {c.vocab_size}, sequence {c.seq_len}",
             f"FLOPs per token (training, the model's flops_per_token): {c.flops_per_token:.3e}"]
    ac_now = f"AC {lay.ac_mode}"
    ac_other = "AC none" if lay.ac_mode != "none" else "AC full"
    title = f"memory per GPU (GB), microbatch {plan.microbatch}:"
    lines.append(f"{title:<37}{ac_now:>11}  {ac_other:>11}")
    now, other = plan.memory.gb(), plan.memory_other_ac.gb()
    for key, label in (("weights", "weights (fp32)"), ("working_copies", "working copies (compute dtype)"),
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
                     + _duration(recipe, step, lay.world_size))
    else:
        lines.append(f"throughput: no {lay.precision} peak for {dev.name} in tessera.train.hardware")
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def _duration(recipe: Recipe, step: float | None, devices: int) -> str:
    if not step:
        return ""
    unit, value = recipe.max_duration.unit, recipe.max_duration.value
    steps = {TimeUnit.BATCH: value, TimeUnit.TOKEN: value / (recipe.global_train_batch_size * recipe.gpt_config()
                                                              .max_seq_len),
             TimeUnit.SAMPLE: value / recipe.global_train_batch_size}.get(unit)
    if steps is None:
        return f"; max_duration {recipe.max_duration}: the epoch length depends on the data"
    hours = steps * step / 3600
    return f"; max_duration {recipe.max_duration}: ~{hours:,.1f} h, {hours * devices:,.0f} GPU-hours"


__all__ = ["GB", "load_for_plan", "model_counts", "plan_dict", "plan_recipe", "recipe_layout", "render"]
