"""LoRA through recipes: what trains, trainable-only checkpoints, bitwise resume, merging, QLoRA on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_fixtures import tiny_llama
from llm_helpers import small_model

from tessera.llm.hf.config import LoraSpec, PretrainedSpec
from tessera.llm.hf.load import QuantizationUnavailable, load_hf
from tessera.llm.hf.lora import add_lora, has_lora, merge_lora
from tessera.llm.recipe import load_recipe
from tessera.llm.train_run import make_trainer
from tessera.train.callbacks import Callback


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("llama") / "model", seed=3)


@pytest.fixture(scope="module")
def gpt_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Tessera GPT export (`tessera llm export`'s default format) to fine-tune from."""
    from tessera.llm.export import save_pretrained

    folder = tmp_path_factory.mktemp("gpt") / "export"
    save_pretrained(small_model(seed=8, attn="rope"), folder)
    return folder


def overrides(model: str, data: Path, save: Path, logs: Path, lora: str = "{rank: 4, alpha: 8, dropout: 0.1}"):
    return [f"model={model}", f"lora={lora}", f"data.train.streams.0.remote={data}", "data.eval=null",
            "global_train_batch_size=4", "device_train_microbatch_size=2", f"save_folder={save}",
            "save_interval=100ba", "log_interval=1ba", "loggers=[jsonl]", f"log_dir={logs}", "torch_threads=1",
            "max_duration=6ba", "scheduler.t_warmup=2ba", "optimizer.lr=1e-2"]


class StopAt(Callback):
    """Stops the run after `batch` (as SIGTERM does: it saves first); records where the run started."""

    def __init__(self, batch: int | None) -> None:
        self.batch, self.started_at = batch, -1

    def on_fit_start(self, trainer) -> None:
        self.started_at = trainer.timestamp.batch

    def on_batch_end(self, trainer, metrics) -> None:
        if self.batch is not None and trainer.timestamp.batch >= self.batch:
            trainer.stop_requested = True


def train(args: list[str], stop_at: int | None = None, started_at: int = 0) -> dict[str, torch.Tensor]:
    trainer = make_trainer(load_recipe("tiny-cpu.yaml", args))
    callback = StopAt(stop_at)
    trainer.callbacks.append(callback)
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert callback.started_at == started_at
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def losses(logs: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


MODELS = {"gpt": "{d_model: 32, n_heads: 4, n_layers: 2, max_seq_len: 32}",
          "gpt-pretrained": "{pretrained: GPT, max_seq_len: 32}",
          "hf": "{pretrained: LLAMA, max_seq_len: 32}"}


@pytest.mark.parametrize("kind", ["gpt", "gpt-pretrained", "hf"])
def test_resume_is_bitwise_and_checkpoints_hold_only_the_adapters(kind, llama, gpt_export, prepped, tmp_path):
    model = MODELS[kind].replace("LLAMA", str(llama)).replace("GPT", str(gpt_export))
    straight = train(overrides(model, prepped, tmp_path / "a", tmp_path / "la"))
    train(overrides(model, prepped, tmp_path / "b", tmp_path / "lb"), stop_at=3)
    assert (tmp_path / "b" / "latest").read_text().strip() == "ep0-ba3"
    resumed = train(overrides(model, prepped, tmp_path / "b", tmp_path / "lc"), started_at=3)
    assert losses(tmp_path / "lb").keys() == {1, 2, 3}
    assert {**losses(tmp_path / "lb"), **losses(tmp_path / "lc")} == losses(tmp_path / "la")
    assert sorted(losses(tmp_path / "la")) == [1, 2, 3, 4, 5, 6]
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)

    saved = torch.load(tmp_path / "b" / "ep0-ba6" / "model.pt", weights_only=True)
    assert saved and all(".lora_" in key for key in saved)  # the frozen base is not in the checkpoint
    moved = [k for k in saved if not torch.equal(saved[k], straight[k])]
    assert not moved
    optimizer = torch.load(tmp_path / "b" / "ep0-ba6" / "train_state.pt", weights_only=False)["optimizers"][0]
    assert len(optimizer["state"]) == len(saved)
    if kind == "gpt-pretrained":  # the frozen base is the export's, and the export step finds it again
        from tessera.llm.export import load_pretrained
        from tessera.llm.hf.export import rebuild

        base = load_pretrained(gpt_export)[0].state_dict()
        assert torch.equal(straight["transformer.blocks.0.attn.Wqkv.base_layer.weight"],
                           base["transformer.blocks.0.attn.Wqkv.weight"])
        rebuilt = rebuild(tmp_path / "b")[0].state_dict()
        assert all(torch.equal(rebuilt[k], straight[k]) for k in straight)


def test_a_lora_checkpoint_is_far_smaller_than_the_base_model(tmp_path, prepped):
    base = tiny_llama(tmp_path / "wide", seed=1)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(base)
    config.hidden_size, config.intermediate_size = 128, 256
    LlamaForCausalLM(config).save_pretrained(base)
    train(overrides(f"{{pretrained: {base}, max_seq_len: 32}}", prepped, tmp_path / "ck", tmp_path / "logs",
                    lora="{rank: 2, target_modules: [q_proj, v_proj]}")[:-3] + ["max_duration=2ba"])
    base_bytes = (base / "model.safetensors").stat().st_size
    ckpt = tmp_path / "ck" / "ep0-ba2"
    total = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    assert (ckpt / "model.pt").stat().st_size < base_bytes / 50
    assert total < base_bytes / 10, (total, base_bytes)


def test_targets_default_per_architecture_and_merge_keeps_the_outputs(llama):
    gpt = add_lora(small_model(seed=2), LoraSpec(rank=4))
    trainable = [n for n, p in gpt.named_parameters() if p.requires_grad]
    assert {n.split(".")[-4] for n in trainable} == {"Wqkv", "out_proj", "up_proj", "down_proj"}
    hf, _ = load_hf(PretrainedSpec(pretrained=str(llama)), LoraSpec(rank=4))
    names = {n.split(".")[-4] for n, p in hf.named_parameters() if p.requires_grad}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    for model in (gpt, hf):
        for name, p in model.named_parameters():
            if "lora_B" in name:  # B starts at zero: give the adapters something to merge
                torch.nn.init.normal_(p, std=0.1)
        model.eval()
        x = torch.randint(0, 250, (2, 10))
        before = model(x)
        merge_lora(model)
        assert not has_lora(model)
        torch.testing.assert_close(model(x), before, atol=1e-5, rtol=1e-4)


def test_unknown_target_module_names_the_key(llama):
    with pytest.raises(ValueError, match="lora.target_modules"):
        add_lora(small_model(), LoraSpec(target_modules=["q_proj"]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU error path")
def test_qlora_on_cpu_is_a_one_line_error(llama):
    with pytest.raises(QuantizationUnavailable, match="needs a CUDA GPU") as info:
        load_hf(PretrainedSpec(pretrained=str(llama)), LoraSpec(quantize_base="4bit"))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["finetune-lora-tiny.yaml", "finetune-lora-llama-8b.yaml",
                                  "finetune-full-llama-8b.yaml"])
def test_shipped_finetune_recipes_validate_once_their_must_set_keys_are_given(name):
    from tessera.llm.recipe import RecipeError

    with pytest.raises(RecipeError, match="model.pretrained must be set"):
        load_recipe(name)
    recipe = load_recipe(name, ["model.pretrained=s3://b/model", "data.train.path=s3://b/chat.jsonl",
                                "save_folder=s3://b/runs"])
    assert recipe.model["pretrained"] == "s3://b/model"
    assert (recipe.lora is None) == ("full" in name)


def test_recipe_model_section_of_a_pretrained_model_is_checked():
    from tessera.llm.recipe import RecipeError

    with pytest.raises(RecipeError, match="dtype"):
        load_recipe("finetune-lora-tiny.yaml", ["model.pretrained=./m", "data.train.path=x.jsonl",
                                                "model.dtype=float8"])
    with pytest.raises(RecipeError, match="lora.rank"):
        load_recipe("finetune-lora-tiny.yaml", ["model.pretrained=./m", "data.train.path=x.jsonl", "lora.rank=0"])


def test_only_models_that_say_so_leave_frozen_weights_out_of_checkpoints():
    from tessera.train.checkpoint import capture_state
    from tessera.train.time import Timestamp

    frozen_by_hand = small_model()
    frozen_by_hand.transformer.wte.weight.requires_grad_(False)  # e.g. after a load_path start
    assert "transformer.wte.weight" in capture_state(frozen_by_hand, timestamp=Timestamp())["model"]
    lora = add_lora(small_model(), LoraSpec(rank=2))
    assert all(".lora_" in k for k in capture_state(lora, timestamp=Timestamp())["model"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU error path")
def test_tessera_train_with_qlora_on_cpu_fails_in_one_line(llama, tmp_path):
    from typer.testing import CliRunner

    from tessera.cli.main import app

    res = CliRunner().invoke(app, ["train", "finetune-lora-tiny.yaml", f"model.pretrained={llama}",
                                   f"data.train.path={tmp_path / 'none.jsonl'}", "lora.quantize_base=4bit"])
    assert res.exit_code != 0
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0], res.output
    res = CliRunner().invoke(app, ["train", "finetune-lora-tiny.yaml", f"model.pretrained={tmp_path / 'nope'}",
                                   f"data.train.path={tmp_path / 'none.jsonl'}"])
    assert res.exit_code != 0 and "model.pretrained=" in res.output and "not a model" in res.output
