"""Every shipped recipe can be inspected (`--print-config`) and planned (`--plan -n 8`) with no GPU, no data
and no download; a model named by a hub id that is not on disk is refused in one line by every command
that loads models, saying that nothing is downloaded at run time and how to place it."""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.export import save_pretrained
from tessera.llm.hf.architectures import architecture_named
from tessera.llm.hf.config import PretrainedSpec
from tessera.llm.model import GPT, GPTConfig
from tessera.llm.model_source import NotAModel, resolve_model_source
from tessera.llm.plan import shape_origin
from tessera.llm.recipe import shipped_recipes
from tessera.llm.recipe_required import unset_keys

runner = CliRunner()
LLAMA_3_8B = 8_030_261_248  # Meta-Llama-3-8B's published parameter count
LORA_R16_LLAMA_3_8B = 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))  # q o, k v, mlp
HUB_ID = "meta-llama/Meta-Llama-3-8B"
PLANNED = {"finetune-lora-tiny.yaml": "model: 0.498B parameters (0.004B trainable), 24 layers, d_model 896",
           "finetune-lora-llama-8b.yaml": "model: 8.072B parameters (0.042B trainable), 32 layers, d_model 4096, "
                                          "vocab 128256, sequence 4096; the llama-3-8b architecture",
           "finetune-full-llama-8b.yaml": "model: 8.030B parameters (8.030B trainable), 32 layers",
           "mpt-7b.yaml": "model: 6.649B parameters (6.649B trainable), 32 layers"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local model folder as far as a plan reads it: a transformers config.json (2 layers, d_model 32)."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("models") / "llama"
    LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256).save_pretrained(folder)
    return folder


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder: inspecting or planning a recipe must leave nothing in it."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def shipped(name: str) -> dict[str, Any]:
    return yaml.safe_load((resources.files("tessera.llm") / "recipes" / name).read_text())


def at(tree: Any, key: str) -> Any:
    for part in key.split("."):
        tree = tree[int(part)] if isinstance(tree, list) else tree[part]
    return tree


def one_line_error(result: Any, *needles: str) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code in (1, 2) and len(lines) == 1, result.output
    assert all(needle in lines[0] for needle in needles), lines[0]
    return lines[0]


@pytest.mark.parametrize("recipe", shipped_recipes())
def test_print_config_of_every_shipped_recipe(recipe: str, workdir: Path) -> None:
    """The resolved config, with every `???` of the recipe still shown as `???` and named on stderr."""
    res = runner.invoke(app, ["train", recipe, "--print-config", "--json"])
    assert res.exit_code == 0, res.output
    printed, unset = json.loads(res.stdout), unset_keys(shipped(recipe))
    assert [key for key in unset if at(printed, key) != "???"] == []
    assert printed["global_train_batch_size"] == shipped(recipe)["global_train_batch_size"]
    assert ("must be set before training" in res.stderr) == bool(unset)
    as_yaml = runner.invoke(app, ["train", recipe, "--print-config"])
    assert as_yaml.exit_code == 0 and as_yaml.stdout.startswith(f"run_name: {printed['run_name']}\n")
    assert os.listdir(workdir) == []


@pytest.mark.parametrize("recipe", shipped_recipes())
def test_plan_of_every_shipped_recipe(recipe: str, workdir: Path, llama: Path) -> None:
    res = runner.invoke(app, ["train", recipe, "--plan", "-n", "8"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"plan: {recipe} on 8 x H100")
    assert PLANNED.get(recipe, "B parameters (") in res.output
    assert "memory per GPU (GB)" in res.output and "  total " in res.output
    assert os.listdir(workdir) == []


def test_the_8b_recipes_plan_llama_3_8b_from_the_table(workdir: Path) -> None:
    """Nothing set: the shape is the table's llama-3-8b. Full fine-tuning keeps fp32 weights, gradients and
    AdamW moments of all 8.03e9 parameters sharded over 8; LoRA keeps the bf16 base sharded and trains
    the adapters only."""
    full = json.loads(runner.invoke(app, ["train", "finetune-full-llama-8b.yaml", "--plan", "-n", "8",
                                          "--json"]).stdout)
    assert (full["params"], full["trainable"], full["sharding"]) == (LLAMA_3_8B, LLAMA_3_8B, "full_shard")
    assert full["memory_gb"]["weights"] == pytest.approx(LLAMA_3_8B * 4 / 8 / 1e9)
    assert full["memory_gb"]["optimizer"] == pytest.approx(LLAMA_3_8B * 8 / 8 / 1e9)
    lora = json.loads(runner.invoke(app, ["train", "finetune-lora-llama-8b.yaml", "--plan", "-n", "8",
                                          "--json"]).stdout)
    assert (lora["params"] - lora["trainable"], lora["trainable"]) == (LLAMA_3_8B, LORA_R16_LLAMA_3_8B)
    assert lora["memory_gb"]["weights"] == pytest.approx((LLAMA_3_8B + LORA_R16_LLAMA_3_8B) * 2 / 8 / 1e9)
    assert lora["memory_gb"]["gradients"] == pytest.approx(LORA_R16_LLAMA_3_8B * 2 / 8 / 1e9)
    assert lora["memory_gb"]["optimizer"] == pytest.approx(LORA_R16_LLAMA_3_8B * 4 / 8 / 1e9)
    assert lora["flops_per_token"] < full["flops_per_token"]  # no weight gradients for the frozen base


def test_a_local_config_json_overrides_the_table_and_a_name_picks_an_entry(workdir: Path, llama: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    own = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(llama)).parameters())
    assert own == 2 * 320 * 32 + 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32) + 32  # untied, GQA
    res = runner.invoke(app, ["train", "finetune-full-llama-8b.yaml", "--plan", "-n", "8", "--json",
                              f"model.pretrained={llama}"])  # the recipe still says architecture: llama-3-8b
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["params"] == own
    res = runner.invoke(app, ["train", "finetune-full-llama-8b.yaml", "--plan", "-n", "8", "--json",
                              "model.architecture=null", f"model.pretrained={HUB_ID}"])  # by the model's name
    assert res.exit_code == 0 and json.loads(res.stdout)["params"] == LLAMA_3_8B, res.output
    origins = [shape_origin(PretrainedSpec(pretrained=url, architecture=arch)) for url, arch in (
        ("s3://bucket/models/Meta-Llama-3-8B/", None), ("s3://bucket/models/m", "Llama-3.1-8B-Instruct"),
        (str(llama), "llama-3-70b"), ("s3://bucket/Qwen2.5-7B-Instruct", None))]
    assert origins == ["llama-3-8b", "llama-3.1-8b", None, "qwen2.5-7b-instruct"]  # None: its config.json
    res = runner.invoke(app, ["train", "finetune-lora-tiny.yaml", "--plan", "-n", "8", "model.architecture=null"])
    one_line_error(res, "--plan needs the model's shape: model.pretrained is unset", "model.architecture")
    res = runner.invoke(app, ["train", "finetune-lora-tiny.yaml", "--plan", "model.architecture=llama-9b"])
    one_line_error(res, "model: architecture 'llama-9b' is not one of: llama-3-8b")
    assert [architecture_named(n) for n in ("Meta-Llama-3-8B-Instruct", "Mistral-7B-Instruct-v0.2", "gpt-2")] \
        == ["llama-3-8b", "mistral-7b-v0.2", None]


def test_a_hub_id_not_on_disk_is_refused_by_every_command_in_one_line(workdir: Path) -> None:
    (workdir / "chat.jsonl").write_text("")
    needles = (f"model '{HUB_ID}' is not on this machine: Tessera does not download at run time",
               f"hf download {HUB_ID} --local-dir ./Meta-Llama-3-8B", "or a bucket path")
    commands = [["train", "finetune-lora-tiny.yaml", f"model.pretrained={HUB_ID}", "data.train.path=chat.jsonl"],
                ["llm", "eval", HUB_ID, "--task", "tiny_mc"], ["llm", "generate", HUB_ID, "--prompt", "hi"],
                ["llm", "export", HUB_ID, "out"], ["llm", "export", HUB_ID, "out", "--format", "hf"]]
    for command in commands:
        one_line_error(runner.invoke(app, command), *needles)
    assert os.listdir(workdir) == ["chat.jsonl"]


def test_one_function_tells_the_kinds_of_model_apart(tmp_path: Path, llama: Path) -> None:
    save_pretrained(GPT(GPTConfig(d_model=32, n_heads=2, n_layers=1, vocab_size=257, max_seq_len=16)),
                    tmp_path / "export")
    (tmp_path / "run").mkdir()
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"format": "something-else"}')
    kinds = {name: resolve_model_source(path).kind
             for name, path in (("hf", llama), ("export", tmp_path / "export"), ("run", tmp_path / "run"))}
    assert kinds == {"hf": "transformers", "export": "export", "run": "checkpoint"}
    for path, message in ((tmp_path / "odd", "neither a transformers config"), (tmp_path / "nope", "no such file"),
                          (llama / "config.json", "a file, not a folder"), (HUB_ID, "is not on this machine")):
        with pytest.raises(NotAModel, match=message):
            resolve_model_source(path)
