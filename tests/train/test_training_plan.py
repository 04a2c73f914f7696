"""`tessera train RECIPE --plan`: counts from the model itself, memory that adds up, a warning when it cannot fit."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.model import GPT, GPTConfig
from tessera.llm.plan import load_for_plan, model_counts, plan_recipe
from tessera.train.hardware import PLAN_GPUS, accelerator, match_device_name
from tessera.train.plan import GB, USABLE_FRACTION, Layout, ModelCounts, make_plan, memory

runner = CliRunner()


def test_counts_are_the_models_own():
    """The meta-device count equals a materialized model's, for a shipped recipe's shape and a small one."""
    recipe = load_for_plan("tiny-cpu.yaml", [])
    counts = model_counts(recipe)
    real = GPT(recipe.gpt_config())
    assert counts.params == real.num_params() == sum(p.numel() for p in real.parameters())
    assert counts.flops_per_token == real.flops_per_token()
    assert counts.block_params == sum(p.numel() for p in real.transformer.blocks[0].parameters())
    big = model_counts(load_for_plan("mpt-7b.yaml", []))
    with torch.device("meta"):
        assert big.params == GPT(GPTConfig.named("mpt-7b")).num_params()
    assert 6.5e9 < big.params < 6.8e9  # MPT-7B's published size


def test_memory_components_add_up_and_shard():
    counts = ModelCounts(params=1_000_000, trainable=1_000_000, n_layers=4, d_model=64, vocab_size=1000,
                         seq_len=128, flops_per_token=6e6)
    ddp = memory(counts, Layout(8, "ddp", 1, 1, "amp_bf16"), microbatch=2)
    assert ddp.total == pytest.approx(ddp.weights + ddp.working_copies + ddp.gradients + ddp.optimizer
                                      + ddp.activations)
    assert (ddp.weights, ddp.gradients, ddp.optimizer) == (4e6, 4e6, 8e6)
    tokens = 2 * 128
    assert ddp.activations == pytest.approx(tokens * (4 * 34 * 64 + 1000 * (2 + 4)))
    fsdp = memory(counts, Layout(8, "full_shard", 8, 1, "amp_bf16"), microbatch=2)
    assert fsdp.weights == ddp.weights / 8 and fsdp.optimizer == ddp.optimizer / 8
    assert fsdp.activations == ddp.activations
    zero2 = memory(counts, Layout(8, "shard_grad_op", 8, 1, "amp_bf16", param_dtype="bfloat16"), microbatch=2)
    assert zero2.gradients == ddp.gradients / 8 and zero2.working_copies == 2e6  # every block stays gathered
    ac = memory(counts, Layout(8, "ddp", 1, 1, "amp_bf16", activation_checkpointing=True), microbatch=2)
    every2 = memory(counts, Layout(8, "ddp", 1, 1, "amp_bf16", "every_n", checkpoint_every=2), microbatch=2)
    assert ac.activations < every2.activations < ddp.activations
    fp32 = memory(counts, Layout(8, "ddp", 1, 1, "fp32"), microbatch=2)
    assert fp32.working_copies == 0 and fp32.activations > ddp.activations
    pure = memory(counts, Layout(8, "ddp", 1, 1, "pure_bf16"), microbatch=2)
    assert (pure.weights, pure.optimizer, pure.working_copies) == (2e6, 4e6, 0)


def test_the_recipe_layout_is_the_trainers_plan():
    """Shard degrees come from the same resolve_plan the Trainer uses: hybrid shards within a node."""
    recipe = load_for_plan("mpt-7b.yaml", ["parallelism.fsdp.sharding=hybrid",
                                           "parallelism.activation_checkpointing=every_n"])
    plan = plan_recipe(recipe, accelerator("H100"), nodes=4)
    assert (plan.layout.world_size, plan.layout.sharding, plan.layout.shard_degree) == (32, "hybrid", 8)
    assert plan.layout.ac_mode == "every_n" and plan.layout.param_dtype == "bfloat16"


def test_a_plan_that_cannot_fit_warns_with_what_would():
    recipe = load_for_plan("mpt-7b.yaml", ["parallelism=ddp", "device_train_microbatch_size=8"])
    plan = plan_recipe(recipe, accelerator("A100-40GB"))
    assert not plan.fits
    assert plan.memory.total > accelerator("A100-40GB").memory_gb * GB * USABLE_FRACTION
    assert any("does not fit" in w and "fsdp" in w for w in plan.warnings)
    sharded = plan_recipe(load_for_plan("mpt-7b.yaml", ["parallelism=fsdp", "device_train_microbatch_size=1"]),
                          accelerator("A100-80GB"), nodes=8)
    assert sharded.fits and not sharded.warnings


def test_throughput_follows_the_stated_efficiency():
    counts = ModelCounts(params=10**9, trainable=10**9, n_layers=24, d_model=2048, vocab_size=50368, seq_len=2048,
                         flops_per_token=6e9)
    h100 = accelerator("H100")
    plan = make_plan(counts, Layout(8, "full_shard", 8), h100, per_device_batch=8, efficiency=0.5)
    assert plan.tokens_per_sec_per_device == pytest.approx(0.5 * 989e12 / 6e9)
    assert plan.tokens_per_sec == pytest.approx(8 * plan.tokens_per_sec_per_device)
    assert plan.mfu == pytest.approx(0.5)
    ac = make_plan(counts, Layout(8, "full_shard", 8, activation_checkpointing=True), h100, per_device_batch=8,
                   efficiency=0.5)
    assert ac.mfu == pytest.approx(0.5 * 6 / 8)  # the recomputed forward is not model FLOPs


def test_hardware_names():
    assert [accelerator(name.lower()).name for name in PLAN_GPUS] == list(PLAN_GPUS)
    assert match_device_name("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert match_device_name("NVIDIA A100-SXM4-40GB").name == "A100-40GB"
    assert match_device_name("NVIDIA H100 80GB HBM3").name == "H100"
    assert match_device_name("NVIDIA H100 PCIe").name == "H100-PCIe"
    assert match_device_name("a CPU") is None
    assert accelerator("H100").peak("amp_bf16") == 989e12 and accelerator("H100").peak("fp8") == 1979e12
    with pytest.raises(ValueError, match="A100-40GB"):
        accelerator("Z80")


def test_cli_plan_prints_memory_and_mfu():
    res = runner.invoke(app, ["train", "mpt-7b.yaml", "--plan"])
    assert res.exit_code == 0, res.output
    assert "memory per GPU (GB)" in res.output and "expected MFU" in res.output and "total" in res.output
    res = runner.invoke(app, ["train", "mpt-7b.yaml", "--plan", "--json", "--gpu", "trn1", "parallelism=fsdp"])
    data = json.loads(res.output)
    assert data["gpu"] == "trn1" and data["devices"] == 16 and data["memory_gb"]["total"] > 0
    assert any("indicative" in w for w in data["warnings"])
    res = runner.invoke(app, ["train", "mpt-7b.yaml", "--plan", "--gpu", "Z80"])
    assert res.exit_code == 2 and "unknown GPU type" in res.output
