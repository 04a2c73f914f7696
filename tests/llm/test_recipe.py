"""Recipes: validation with clear errors, overrides, and a short `tessera train` that autoresumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from llm_helpers import write_text_corpus
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.prep import prep
from tessera.llm.recipe import RecipeError, load_recipe, shipped_recipes
from tessera.train.optim import DecoupledAdamW

runner = CliRunner()


@pytest.mark.parametrize("name", ["tiny-cpu.yaml", "mpt-125m.yaml", "mpt-1b.yaml", "mpt-7b.yaml"])
def test_shipped_recipes_validate(name: str) -> None:
    assert name in shipped_recipes()
    paths = ["data.train.streams.0.remote=s3://b/d", "data.eval.streams.0.remote=s3://b/d", "save_folder=s3://b/r"]
    recipe = load_recipe(name, paths)  # the recipes mark these `???` (must be set) or give local defaults
    assert recipe.gpt_config().n_layers >= 1 and recipe.check_batches(1) > 0


@pytest.mark.parametrize(("override", "message"), [
    ("model.n_layerz=2", "did you mean 'model.n_layers'"),
    ("optimizer.lrr=1", "did you mean 'optimizer.lr'"),
    ("data.train.shufle=false", "did you mean 'data.train.shuffle'"),
    ("global_train_batch_size=lots", "global_train_batch_size"),
    ("precision=fp8", "precision"),
    ("model.d_model=130", "divisible by model.n_heads"),
    ("nonsense", "key.path=value"),
])
def test_bad_overrides_name_the_key(override: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_recipe("tiny-cpu.yaml", [override])


def test_overrides_and_batch_arithmetic() -> None:
    recipe = load_recipe("tiny-cpu.yaml", ["model.n_layers=2", "optimizer.betas=[0.8,0.9]",
                                           "data.train.streams.0.remote=s3://b/x"])
    assert recipe.gpt_config().n_layers == 2 and recipe.optimizer.betas == (0.8, 0.9)
    assert recipe.data.train.streams[0].remote == "s3://b/x"
    bad = load_recipe("tiny-cpu.yaml", ["global_train_batch_size=12", "device_train_microbatch_size=5"])
    with pytest.raises(RecipeError, match="does not divide the per-device batch 6"):
        bad.check_batches(2)
    with pytest.raises(RecipeError, match="not divisible by the world size 5"):
        bad.check_batches(5)


def test_print_config_and_cli_error() -> None:
    res = runner.invoke(app, ["train", "tiny-cpu.yaml", "--print-config", "model.n_layers=3"])
    assert res.exit_code == 0 and yaml.safe_load(res.stdout)["model"]["n_layers"] == 3
    res = runner.invoke(app, ["train", "tiny-cpu.yaml", "optimizer.lrr=1"])
    assert res.exit_code == 2 and "optimizer.lr" in res.output


def test_decoupled_weight_decay_follows_the_schedule_not_the_lr() -> None:
    p = torch.nn.Parameter(torch.ones(4))
    opt = DecoupledAdamW([p], lr=0.5, weight_decay=0.01)
    p.grad = torch.zeros(4)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((4,), 0.99))  # decay 0.01 at the initial lr
    opt.param_groups[0]["lr"] = 0.25  # the schedule halves the lr: half the decay
    opt.step()
    assert torch.allclose(p.detach(), torch.full((4,), 0.99 * 0.995))


def test_train_recipe_end_to_end_with_autoresume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_text_corpus(tmp_path / "corpus", 40)
    prep(tmp_path / "corpus", tmp_path / "data", "byte", seq_len=32, val_fraction=0.2)
    monkeypatch.chdir(tmp_path)
    common = ["tiny-cpu.yaml", "model.d_model=32", "model.n_layers=1", "model.max_seq_len=32",
              "data.train.streams.0.remote=./data", "data.eval.streams.0.remote=./data", "data.eval.max_batches=2",
              "global_train_batch_size=4", "device_train_microbatch_size=2", "save_interval=2ba",
              "eval_interval=3ba", "log_interval=1ba", "loggers=[jsonl]", "torch_threads=1"]
    assert runner.invoke(app, ["train", *common, "max_duration=4ba"]).exit_code == 0
    ckpts = tmp_path / "runs" / "tiny-cpu" / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "ep0-ba4"
    res = runner.invoke(app, ["train", *common, "max_duration=6ba"])
    assert res.exit_code == 0, res.output
    assert (ckpts / "latest").read_text().strip() == "ep0-ba6"
    steps = [json.loads(line).get("step") for line in (tmp_path / "logs" / "tiny-cpu" / "metrics.jsonl").open()]
    assert 5 in steps and steps.count(1) == 1  # the second run continued at step 5, it did not restart
    meta = json.loads((ckpts / "ep0-ba6" / "meta.json").read_text())
    assert meta["config"]["model"]["d_model"] == 32 and meta["config"]["tokenizer"] == "byte"
    res = runner.invoke(app, ["llm", "generate", str(ckpts), "--prompt", "def ", "--max-new-tokens", "5",
                              "--greedy", "--json"])
    assert res.exit_code == 0, res.output
