"""`tessera train` on LLM Foundry's train YAML, unchanged: YAMLs written here in the shape of Foundry's
published ones (scripts/train/yamls: the same keys and structures), with Foundry's own overrides.

Pre-training (mpt_causal_lm; hf_causal_lm for GPT-2, GPT-Neo, OPT and Llama built as tiny local models) and
fine-tuning (prompt/response JSONL and MDS, LoRA via peft_config) print as the Tessera recipe they become;
what Tessera cannot do (a mixture-of-experts FFN, an encoder-decoder, a hub name not on disk) is refused
in one line with exit 2; three of them train 3 batches on the CPU, printing a loss.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from anchors import MDSWriter
from hf_fixtures import chat_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_helpers import assert_one_line_error
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.foundry import FoundryError, FoundryWarning, is_foundry
from tessera.llm.foundry.mpt import mpt_model
from tessera.llm.foundry.resolve import resolved
from tessera.llm.hf.mpt import MptUnsupported, gpt_config_from_mpt
from tessera.llm.recipe import load_recipe

runner = CliRunner()
SEQ = 32

# --- Foundry-shaped YAMLs (written here; the keys and structure of Foundry's published files) ------------


def text_loader(key: str, split: str, train: bool) -> str:
    """A `name: text` loader over MDS, as every pre-training YAML of Foundry's writes it."""
    flag = str(train).lower()
    return f"""{key}:
  name: text
  dataset:
    local: ${{variables.data_local}}
    remote: ${{variables.data_remote}}
    split: {split}
    shuffle: {flag}
    max_seq_len: ${{variables.max_seq_len}}
    shuffle_seed: ${{variables.global_seed}}
  drop_last: {flag}
  num_workers: 0
"""


MPT_PRETRAIN = """\
variables:
  data_local: @DATA@
  data_remote:  # If blank, files must be present in data_local
  max_seq_len: 32
  global_seed: 17
  run_name: mpt_causal_lm_cpu

max_seq_len: ${variables.max_seq_len}
run_name: ${variables.run_name}

model:
  name: mpt_causal_lm
  init_device: cpu
  d_model: 16
  n_heads: 4
  n_layers: 2
  expansion_ratio: 5
  max_seq_len: ${variables.max_seq_len}
  vocab_size: 320
  attn_config:
    attn_impl: flash
  loss_fn: torch_crossentropy

tokenizer:
  name: EleutherAI/gpt-neox-20b
  kwargs:
    model_max_length: ${variables.max_seq_len}

@TRAIN_LOADER@
@EVAL_LOADER@
scheduler:
  name: cosine_with_warmup
  t_warmup: 1ba
  alpha_f: 0.1

optimizer:
  name: decoupled_adamw
  lr: 6.0e-3
  betas:
  - 0.9
  - 0.95
  eps: 1.0e-08
  weight_decay: 0.0

algorithms:
  gradient_clipping:
    clipping_type: norm
    clipping_threshold: 1.0

max_duration: 10ba
eval_interval: 5ba
eval_first: false
eval_subset_num_batches: 2
global_train_batch_size: 8
autoresume: false

seed: ${variables.global_seed}
device_eval_batch_size: 4
device_train_microbatch_size: 4
precision: fp32

fsdp_config:
  sharding_strategy: FULL_SHARD
  mixed_precision: PURE
  activation_checkpointing: false
  activation_checkpointing_reentrant: false
  activation_cpu_offload: false
  limit_all_gathers: true

progress_bar: false
log_to_console: true
console_log_interval: 1ba

callbacks:
  speed_monitor:
    window_size: 10
  lr_monitor: {}
  memory_monitor: {}
  runtime_estimator: {}

save_overwrite: true
save_num_checkpoints_to_keep: 1  # Important, this cleans up checkpoints saved to DISK
"""

MPT_PRETRAIN = MPT_PRETRAIN.replace("@TRAIN_LOADER@", text_loader("train_loader", "train", True)).replace(
    "@EVAL_LOADER@", text_loader("eval_loader", "val", False))

# testing.yaml's shape: meta init, torch attention, amp_bf16, the whole eval set, no run_name.
TESTING = (MPT_PRETRAIN.replace("  run_name: mpt_causal_lm_cpu", "  run_name:  # If left blank, will be read from env var $RUN_NAME")
           .replace("init_device: cpu", "init_device: meta").replace("attn_impl: flash", "attn_impl: torch")
           .replace("precision: fp32", "precision: amp_bf16").replace("eval_subset_num_batches: 2", "eval_subset_num_batches: -1")
           .replace("expansion_ratio: 5", "expansion_ratio: 4").replace("save_overwrite: true\n", ""))

HF_PRETRAIN = """\
variables:
  data_local: ./my-copy-c4
  data_remote:  # If blank, files must be present in data_local
  tokenizer_name: gpt2
  global_seed: 17
  max_seq_len: 64
  run_name:  # If left blank, will be read from env var $RUN_NAME

max_seq_len: ${variables.max_seq_len}
run_name: ${variables.run_name}

model:
  name: hf_causal_lm
  pretrained_model_name_or_path: gpt2
  config_overrides:
    @POSITIONS@: ${variables.max_seq_len}
  pretrained: false  # false: only use the architecture; true: initialize with pretrained weights

tokenizer:
  name: ${variables.tokenizer_name}
  kwargs:
    model_max_length: ${variables.max_seq_len}

@TRAIN_LOADER@
scheduler:
  name: linear_decay_with_warmup
  t_warmup: 100ba

optimizer:
  name: decoupled_lionw
  lr: 6.0e-4
  betas:
  - 0.9
  - 0.95
  weight_decay: 0.0

max_duration: 4800ba
eval_interval: 500ba
global_train_batch_size: 256
seed: ${variables.global_seed}
device_train_microbatch_size: 4
precision: amp_bf16
"""

HF_PRETRAIN = HF_PRETRAIN.replace("@TRAIN_LOADER@", text_loader("train_loader", "train", True))

FINETUNE = """\
variables:
  global_seed: 17
  max_seq_len: 64
  run_name:  # If left blank, will be read from env var $RUN_NAME

max_seq_len: ${variables.max_seq_len}
run_name: ${variables.run_name}

model:
  name: hf_causal_lm
  pretrained: true
  pretrained_model_name_or_path: @MODEL@
  use_flash_attention_2: true
  peft_config:
    r: 4
    peft_type: LORA
    task_type: CAUSAL_LM
    lora_alpha: 8
    lora_dropout: 0.0

tokenizer:
  name: @MODEL@
  kwargs:
    model_max_length: ${variables.max_seq_len}

train_loader:
  name: finetuning
  dataset:
    hf_name: @DATA@
    split: train
    max_seq_len: ${variables.max_seq_len}
    allow_pad_trimming: false
    decoder_only_format: true
    packing_ratio: auto
    shuffle: true
  drop_last: true
  num_workers: 0

scheduler:
  name: linear_decay_with_warmup  # linear no warmup is HF default which dolly used
  t_warmup: 0ba
  alpha_f: 0

optimizer:
  name: decoupled_adamw
  lr: 1.0e-3
  betas:
  - 0.9
  - 0.999
  eps: 1.0e-8
  weight_decay: 0

max_duration: 3ba
eval_interval: 1  # this is the only allowed value for no eval
global_train_batch_size: 4
seed: ${variables.global_seed}
device_train_microbatch_size: 4
precision: fp32
progress_bar: false
log_to_console: true
console_log_interval: 1ba
"""

FINETUNE_MDS = """\
variables:
  global_seed: 17
  max_seq_len: 64
  data_local: ./my_data
  data_remote:  # If blank, files must be present in data_local

max_seq_len: ${variables.max_seq_len}

model:
  name: hf_causal_lm
  pretrained_model_name_or_path: @MODEL@
  pretrained: true

tokenizer:
  name: @MODEL@

train_loader:
  name: finetuning
  dataset:
    streams:
      my_data:
        remote: ${variables.data_remote}
        local: ${variables.data_local}
        split: train
    shuffle: true
    max_seq_len: ${variables.max_seq_len}
    decoder_only_format: true
  drop_last: true
  num_workers: 0

scheduler: {name: cosine_with_warmup, t_warmup: 100ba, alpha_f: 0.1}
optimizer: {name: decoupled_adamw, lr: 6.0e-4, betas: [0.9, 0.95], eps: 1.0e-08, weight_decay: 0.0}
max_duration: 1ep
global_train_batch_size: 8
device_train_microbatch_size: 8
precision: fp32
"""

MOE = MPT_PRETRAIN.replace("  d_model: 16\n", """  d_model: 16
  ffn_config:
    ffn_type: mb_dmoe
    memory_optimized_mlp: true
    moe_num_experts: 4
    moe_top_k: 2
""")

T5 = FINETUNE.replace("name: hf_causal_lm", "name: hf_t5").replace("decoder_only_format: true",
                                                                    "decoder_only_format: false")
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly bugs".split()


def write(folder: Path, name: str, text: str, **fill: str | Path) -> Path:
    for key, value in fill.items():
        text = text.replace(f"@{key}@", str(value))
    path = folder / name
    path.write_text(text)
    return path


# --- data and models, built once ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A GPT-NeoX-like tokenizer folder, tiny GPT-2/GPT-Neo/OPT/Llama folders (a chat tokenizer each), MDS of
    raw `text` and of `tokens`, and prompt/response examples as JSONL (train/test) and as MDS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoConfig,
        GPTNeoForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        OPTConfig,
        OPTForCausalLM,
        PreTrainedTokenizerFast,
        T5Config,
        T5ForConditionalGeneration,
    )

    root = tmp_path_factory.mktemp("foundry")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator([" ".join(WORDS)] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(root / "neox-tok")
    chat = chat_tokenizer()
    vocab = len(chat)
    shapes = {"gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=16, n_layer=1, n_head=2, n_positions=64)),
              "gpt-neo": GPTNeoForCausalLM(GPTNeoConfig(vocab_size=vocab, hidden_size=16, num_layers=1, num_heads=2,
                                                        attention_types=[[["global"], 1]], max_position_embeddings=64)),
              "opt": OPTForCausalLM(OPTConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                                              num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=16)),
              "llama": LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                                                    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                                    max_position_embeddings=64)),
              "t5": T5ForConditionalGeneration(T5Config(vocab_size=vocab, d_model=16, d_ff=32, num_layers=1,
                                                        num_heads=2, d_kv=8))}
    for name, model in shapes.items():
        model.save_pretrained(root / name)
        chat.save_pretrained(root / name)
    rng = np.random.default_rng(0)
    for split, n in (("train", 48), ("val", 8)):
        with MDSWriter(out=str(root / "text" / split), columns={"text": "str"}) as writer:
            for _ in range(n):
                writer.write({"text": " ".join(rng.choice(WORDS, size=int(rng.integers(4, 30))))})
        with MDSWriter(out=str(root / "tokens" / split), columns={"tokens": "ndarray:int32"}) as writer:
            for _ in range(n):
                writer.write({"tokens": rng.integers(0, 300, size=SEQ).astype(np.int32)})
    examples = [{"prompt": f"reverse: {a} {b}", "response": f" {b} {a}"}
                for a, b in zip(rng.choice(WORDS, 40), rng.choice(WORDS, 40), strict=True)]
    (root / "sft").mkdir()
    for split in ("train", "test"):
        (root / "sft" / f"{split}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))
    with MDSWriter(out=str(root / "sft-mds" / "train"), columns={"prompt": "str", "response": "str"}) as writer:
        for example in examples:
            writer.write(example)
    return {name: root / name for name in ("neox-tok", *shapes, "text", "tokens", "sft", "sft-mds")} | {"root": root}


def tessera(*args: str | Path):
    return runner.invoke(app, [str(a) for a in args])


def printed(result) -> dict:
    """The recipe `--print-config` printed (the YAML before the plan's comments)."""
    assert result.exit_code == 0, result.output
    text = result.stdout.split("# resolved for")[0]
    assert "${" not in text
    return yaml.safe_load(text)


# --- translation -----------------------------------------------------------------------------------------


def test_mpt_pretrain_prints_the_recipe_it_becomes(made, tmp_path: Path) -> None:
    yaml_file = write(tmp_path, "mpt-small-cpu.yaml", MPT_PRETRAIN, DATA="./my-copy-c4")
    with pytest.warns(FoundryWarning) as said:
        res = tessera("train", yaml_file, f"variables.data_local={made['text']}", f"tokenizer.name={made['neox-tok']}",
                      "max_duration=3ba", "variables.max_seq_len=24", "--print-config")
    recipe = printed(res)
    assert recipe["model"] == {"d_model": 16, "n_heads": 4, "n_layers": 2, "vocab_size": 320, "max_seq_len": 24,
                               "expansion_ratio": 5, "no_bias": False, "tie_embeddings": True, "norm": "layernorm",
                               "norm_eps": 1e-5, "attn": "learned", "dropout": 0.0}  # MPT's defaults, not Tessera's
    assert recipe["tokenizer"] == str(made["neox-tok"]) and recipe["run_name"] == "mpt_causal_lm_cpu"
    stream = recipe["data"]["train"]["streams"][0]
    assert (stream["local"], stream["remote"], stream["split"]) == (str(made["text"]), None, "train")
    assert (recipe["data"]["eval"]["batch_size"], recipe["data"]["eval"]["max_batches"]) == (4, 2)
    assert recipe["max_duration"] == "3ba" and recipe["eval_interval"] == "5ba" and recipe["log_interval"] == "1ba"
    assert (recipe["grad_clip_norm"], recipe["precision"], recipe["device_train_microbatch_size"]) == (1.0, "fp32", 4)
    assert recipe["scheduler"] == {"name": "cosine_with_warmup", "t_warmup": "1ba", "alpha_f": 0.1}
    assert recipe["parallelism"]["fsdp"]["sharding"] == "full_shard" and recipe["parallelism"]["data_parallel"] == "fsdp"
    warnings = [str(w.message) for w in said]
    assert len(warnings) == 2 and "attn_impl=flash" in warnings[0] and "kaiming_normal_" in warnings[1]


@pytest.mark.parametrize("arch,positions", [("gpt2", "n_positions"), ("gpt-neo", "max_position_embeddings"),
                                            ("opt", "max_position_embeddings"), ("llama", "max_position_embeddings")])
def test_hf_causal_lm_pretraining_from_scratch(made, tmp_path: Path, arch: str, positions: str) -> None:
    yaml_file = write(tmp_path, f"{arch}.yaml", HF_PRETRAIN, POSITIONS=positions)
    recipe = printed(tessera("train", yaml_file, f"model.pretrained_model_name_or_path={made[arch]}",
                             f"variables.tokenizer_name={made[arch]}", f"variables.data_local={made['tokens']}",
                             "--print-config"))
    assert recipe["model"]["pretrained"] == str(made[arch]) and recipe["tokenizer"] == str(made[arch])
    assert recipe["model"]["random_init"] is True and recipe["model"]["config_overrides"] == {positions: 64}
    assert recipe["optimizer"] == {"name": "decoupled_lionw", "lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                   "weight_decay": 0.0}
    assert recipe["scheduler"] == {"name": "linear_with_warmup", "t_warmup": "100ba", "alpha_f": 0.0}  # Composer's
    assert recipe["grad_clip_norm"] is None and recipe["data"]["eval"] is None and recipe["eval_interval"] is None


def test_random_init_builds_the_architecture_with_its_overrides(made) -> None:
    """pretrained: false builds config.json's architecture (after config_overrides) with fresh weights."""
    import torch

    from tessera.llm.hf.config import PretrainedSpec
    from tessera.llm.hf.load import load_hf

    spec = PretrainedSpec(pretrained=str(made["gpt2"]), random_init=True, config_overrides={"n_positions": 48})
    fresh, _ = load_hf(spec)
    trained, _ = load_hf(PretrainedSpec(pretrained=str(made["gpt2"])))
    assert fresh.hf.config.n_positions == 48 and fresh.hf.transformer.wpe.weight.shape[0] == 48
    assert trained.hf.transformer.wpe.weight.shape[0] == 64
    assert not torch.equal(fresh.hf.transformer.h[0].attn.c_attn.weight, trained.hf.transformer.h[0].attn.c_attn.weight)
    with pytest.raises(ValueError, match=r"model.config_overrides.max_seq_len: GPT2Config has no such key"):
        load_hf(PretrainedSpec(pretrained=str(made["gpt2"]), config_overrides={"max_seq_len": 8}))


def test_finetuning_jsonl_with_lora(made, tmp_path: Path) -> None:
    yaml_file = write(tmp_path, "7b_dolly_sft.yaml", FINETUNE, MODEL="mosaicml/mpt-7b", DATA="mosaicml/dolly_hhrlhf")
    with pytest.warns(FoundryWarning, match="use_flash_attention_2: .* attn_implementation=sdpa"):
        recipe = printed(tessera("train", yaml_file, f"model.pretrained_model_name_or_path={made['llama']}",
                                 f"tokenizer.name={made['llama']}", f"train_loader.dataset.hf_name={made['sft']}",
                                 "--print-config"))
    assert recipe["lora"] == {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"],
                              "quantize_base": None}  # peft's default targets for Llama, as peft picks them
    train = recipe["data"]["train"]
    assert (train["path"], train["pack"], train["loss_on"]) == (str(made["sft"] / "train.jsonl"), True,
                                                                 "last_assistant")
    assert "attn_implementation" not in recipe["model"]  # sdpa, the default: flash attention's maths


def test_finetuning_mds_streams(made, tmp_path: Path) -> None:
    yaml_file = write(tmp_path, "gpt2-arc-easy-cpu-streaming-dataset.yaml", FINETUNE_MDS, MODEL=made["gpt2"])
    recipe = printed(tessera("train", yaml_file, f"variables.data_local={made['sft-mds']}", "--print-config"))
    assert recipe["data"]["train"]["path"] == str(made["sft-mds"] / "train")
    assert recipe["data"]["train"]["pack"] is False and recipe["lora"] is None


def test_recipe_convert_writes_what_train_runs(made, tmp_path: Path) -> None:
    yaml_file = write(tmp_path, "mpt-small-cpu.yaml", MPT_PRETRAIN, DATA=made["text"])
    args = [f"tokenizer.name={made['neox-tok']}"]
    out = tmp_path / "converted" / "mpt-small.yaml"
    res = tessera("recipe", "convert", yaml_file, *args, "-o", out)
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("# Converted from LLM Foundry's mpt-small-cpu.yaml")
    assert not is_foundry(yaml.safe_load(out.read_text()))
    assert load_recipe(str(out)).dump() == load_recipe(str(yaml_file), args).dump()


# --- refusals: exit 2, one line naming the key -----------------------------------------------------------


MPT_SMALL = {"d_model": 32, "n_heads": 4, "n_layers": 1, "vocab_size": 50, "max_seq_len": 16}
BASELINE = {"init_config": {"name": "baseline_"}}  # Tessera's init: no warning


@pytest.mark.parametrize("change, mapped", [
    ({}, {"attn": "learned", "no_bias": False, "expansion_ratio": 4, "dropout": 0.0}),  # MPTConfig's defaults
    ({"ffn_config": {"ffn_hidden_size": 96}}, {"expansion_ratio": 3}),  # Foundry ignores expansion_ratio then
    ({"attn_config": {"attn_type": "grouped_query_attention", "kv_n_heads": 4, "softmax_scale": 8 ** -0.5}},
     {"n_heads": 4}),
    ({"attn_config": {"rope": True, "rope_dail_config": {"type": "original"}}, "learned_pos_emb": True},
     {"attn": "rope", "rope_theta": 10000.0}),
    ({"attn_config": {"alibi": True, "rope": True}}, "attn_config.rope"),
    ({"attn_config": {"attn_temperature_tuning": {"attn_scale": 0.5}}}, "attn_config.attn_temperature_tuning"),
    ({"attn_config": {"attn_type": "multiquery_attention"}}, "attn_config.attn_type=multiquery_attention"),
    ({"attn_config": {"attn_type": "grouped_query_attention"}}, "attn_config.attn_type=grouped_query_attention"),
    ({"attn_config": {"nope": True}}, "attn_config.nope=True"),
    ({"emb_pdrop": 0.1}, "emb_pdrop"),
    ({"norm_type": "triton_layernorm"}, "norm_type=triton_layernorm"),
    ({"ffn_config": {"ffn_type": "mptmlp", "moe_top_k": 2}}, "ffn_config.moe_top_k"),
])
def test_a_foundry_model_section_maps_as_the_same_mpt_config_json(change, mapped) -> None:
    """hf/mpt.py owns the MPT mapping: a YAML's model section and a checkpoint's config map (or are refused,
    naming the same key) alike; absent keys are MPTConfig's defaults, not GPTConfig's."""
    config = {**MPT_SMALL, **change}
    if isinstance(mapped, str):
        with pytest.raises(FoundryError) as foundry:
            mpt_model({"name": "mpt_causal_lm", "attn_config": {"attn_impl": "torch"}, **config}, None)
        with pytest.raises(MptUnsupported) as checkpoint:
            gpt_config_from_mpt(config, "ckpt.pt")
        assert str(foundry.value).startswith(f"model.{mapped}") and "\n" not in str(foundry.value)
        assert str(checkpoint.value).startswith(f"ckpt.pt: {mapped}")
        return
    recipe = mpt_model({"name": "mpt_causal_lm", **BASELINE, **config, "attn_config": {"attn_impl": "torch",
                                                                           **config.get("attn_config", {})}}, None)
    checkpoint = gpt_config_from_mpt(config, "ckpt.pt").to_dict()
    assert recipe == {key: checkpoint[key] for key in recipe} and recipe.items() >= mapped.items()


def test_an_mpt_model_section_without_sizes_is_mpt_s_default_shape() -> None:
    recipe = mpt_model({"name": "mpt_causal_lm", **BASELINE, "attn_config": {"attn_impl": "torch"}}, None)
    assert [recipe[k] for k in ("d_model", "n_heads", "n_layers", "vocab_size", "max_seq_len")] == \
        [2048, 16, 24, 50368, 2048]  # MPTConfig's, not GPTConfig's 256 x 4 x 4


def test_refusals_name_the_key(made, tmp_path: Path) -> None:
    moe = write(tmp_path, "testing-moe.yaml", MOE, DATA=made["text"])
    tok = f"tokenizer.name={made['neox-tok']}"
    assert_one_line_error(tessera("train", moe, tok, "--print-config"), 2, "model.ffn_config.ffn_type=mb_dmoe",
                          "mixture-of-experts")
    assert_one_line_error(tessera("train", moe, tok), 2, "model.ffn_config.ffn_type")  # before anything starts
    t5 = write(tmp_path, "t5-small_dolly_sft.yaml", T5, MODEL=made["t5"], DATA=made["sft"])
    assert_one_line_error(tessera("train", t5, "--print-config"), 2, "model.name=hf_t5", "encoder-decoder")
    t5_as_causal = write(tmp_path, "t5-causal.yaml", FINETUNE, MODEL=made["t5"], DATA=made["sft"])
    assert_one_line_error(tessera("train", t5_as_causal, "--print-config"), 2,
                          "model.pretrained_model_name_or_path", "encoder-decoder")
    mpt = write(tmp_path, "mpt.yaml", MPT_PRETRAIN, DATA=made["text"])
    hub = assert_one_line_error(tessera("train", mpt, "--print-config"), 2, "tokenizer.name",
                                "EleutherAI/gpt-neox-20b", "hf download", "tokenizer.name=./gpt-neox-20b")
    assert "mpt.yaml" in hub
    assert_one_line_error(tessera("train", mpt, tok, "model.attn_config.attn_type=grouped_query_attention",
                                  "--print-config"), 2, "model.attn_config.attn_type")
    assert_one_line_error(tessera("train", mpt, tok, "callbacks.hf_checkpointerr={}", "--print-config"), 2,
                          "callbacks.hf_checkpointerr")
    assert_one_line_error(tessera("train", mpt, tok, "max_durations=3ba", "--print-config"), 2, "max_durations",
                          "not a key of LLM Foundry's train YAML")
    assert_one_line_error(tessera("train", mpt, tok, "variables.max_seq_len=${oc.env:HOME}", "--print-config"), 2,
                          "oc.env")
    assert_one_line_error(tessera("train", mpt, tok, "optimizer.betas.0=0.8", "--print-config"), 2,
                          "optimizer.betas.0=0.8", "set the whole list")
    sft = write(tmp_path, "dolly.yaml", FINETUNE, MODEL=made["llama"], DATA="mosaicml/dolly_hhrlhf")
    assert_one_line_error(tessera("train", sft, "--print-config"), 2, "train_loader.dataset.hf_name",
                          "hf download mosaicml/dolly_hhrlhf --repo-type dataset")


def test_a_top_level_key_holding_an_anchor_is_ignored_with_a_warning(made, tmp_path: Path) -> None:
    """1b_local_data_sft.yaml's `dataset: &hf_dataset` (older Foundry ignored it, newer refuses it)."""
    text = FINETUNE.replace("train_loader:\n  name: finetuning\n  dataset:\n    hf_name: @DATA@\n",
                            "dataset: &hf_dataset\n  hf_name: @DATA@\n\ntrain_loader:\n  name: finetuning\n  dataset:\n"
                            "    <<: *hf_dataset\n")
    yaml_file = write(tmp_path, "1b_local_data_sft.yaml", text, MODEL=made["llama"], DATA=made["sft"])
    with pytest.warns(FoundryWarning, match="dataset: not a key of LLM Foundry's train YAML; it holds a YAML anchor"):
        res = tessera("train", yaml_file, "--print-config")
    assert printed(res)["data"]["train"]["path"] == str(made["sft"] / "train.jsonl")


# --- Foundry's override parser: dotted keys merged, then ${...} resolved ----------------------------------

NAMES = st.text("abcdefgh_", min_size=1, max_size=5)  # never variables, copy or kept
WORDS_ = st.from_regex(r"[a-z][a-z0-9]{0,7}", fullmatch=True).filter(
    lambda w: w not in ("true", "false", "null", "nan", "inf", "yes", "no", "on", "off"))
VALUES = st.one_of(st.integers(-10**6, 10**6), st.booleans(), WORDS_)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(NAMES, min_size=1, max_size=3), value=VALUES, n=st.integers(1, 9))
def test_overrides_merge_before_interpolation(keys: list[str], value, n: int) -> None:
    """`a.b.c=VALUE` sets that key with VALUE's type (as OmegaConf.from_cli parses it, so as Foundry does),
    and `variables.n=...` reaches every `${variables.n}`: overrides merge first, interpolations resolve after."""
    tree = {"variables": {"n": n}, "copy": "${variables.n}", "kept": {"x": 1}}
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    out = resolved(tree, [f"{'.'.join(keys)}={shown}", f"variables.n={n + 1}"])
    node = out
    for key in keys[:-1]:
        node = node[key]
    assert node[keys[-1]] == value and type(node[keys[-1]]) is type(value)
    assert out["copy"] == n + 1 and out["kept"] == {"x": 1}


@settings(max_examples=30, deadline=None)
@given(item=st.sampled_from(["novalue", "=3", "a..b=1", ".a=1", "a.=1"]))
def test_malformed_overrides_are_refused(item: str) -> None:
    with pytest.raises(FoundryError, match=re.escape(repr(item))):
        resolved({"variables": {}}, [item])


# --- three of them train 3 batches on the CPU ---------------------------------------------------------------

LOSS = re.compile(r"\[train\] step (\d+) \| loss ([0-9.]+)")


def trained(result) -> list[float]:
    assert result.exit_code == 0, result.output
    losses = [(int(step), float(loss)) for step, loss in LOSS.findall(result.output)]
    assert [step for step, _ in losses] == [1, 2, 3]
    assert all(math.isfinite(loss) and loss > 0 for _, loss in losses)
    return [loss for _, loss in losses]


def test_mpt_small_cpu_trains_on_text_mds(made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         s3_bucket: str) -> None:
    """The tokenizer and the data in a bucket, as a Foundry user's remote: the tokenizer folder is fetched
    once into the model cache, the shards into data_local."""
    from tessera.storage import open_store

    for folder in ("neox-tok", "text"):
        store = open_store(f"{s3_bucket}/{folder}")
        for file in made[folder].rglob("*"):
            if file.is_file():
                store.put(file.relative_to(made[folder]).as_posix(), file.read_bytes())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path / "models"))
    yaml_file = write(tmp_path, "mpt-small-cpu.yaml", MPT_PRETRAIN, DATA="./my-copy-c4")
    losses = trained(tessera("train", yaml_file, f"variables.data_remote={s3_bucket}/text",
                             f"tokenizer.name={s3_bucket}/neox-tok", "max_duration=3ba"))
    assert abs(losses[0] - math.log(320)) < 0.5  # near uniform over the model's vocabulary at the start
    assert (tmp_path / "my-copy-c4" / "train" / "index.json").is_file()


def test_testing_yaml_trains_on_token_mds(made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    yaml_file = write(tmp_path, "testing.yaml", TESTING, DATA="./my-copy-c4")
    trained(tessera("train", yaml_file, f"variables.data_local={made['tokens']}", f"tokenizer.name={made['neox-tok']}",
                    "max_duration=3ba"))


def test_gpt2_finetunes_on_local_prompt_response(made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    yaml_file = write(tmp_path, "gpt2-dolly.yaml", FINETUNE, MODEL="gpt2", DATA="mosaicml/dolly_hhrlhf")
    res = tessera("train", yaml_file, f"model.pretrained_model_name_or_path={made['gpt2']}",
                  f"tokenizer.name={made['gpt2']}", f"train_loader.dataset.hf_name={made['sft']}")
    trained(res)
    assert "40 examples of 40 records" in res.output


def test_preprocessing_fn_maps_each_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Foundry's `preprocessing_fn: module:function` runs on every record before it is read as a row; what
    it raises makes that record a bad row (named with its place); a module that is not there, one line."""
    from tessera.llm.finetune.prep import prep_examples
    from tessera.llm.finetune.rows import ExampleError

    (tmp_path / "my_prep.py").write_text(
        "def dolly(r):\n    return {'prompt': r['instruction'] + '\\n', 'response': r['output']}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "dolly.jsonl"
    rows = [{"instruction": f"say {i}", "output": f" {i}"} for i in range(5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = prep_examples(data, tmp_path / "out", "byte", seq_len=32, preprocessing_fn="my_prep:dolly")
    assert (summary.examples, summary.bad_rows) == (5, 0)
    data.write_text(data.read_text() + json.dumps({"question": "no instruction"}) + "\n")
    with pytest.raises(ExampleError, match=r"dolly.jsonl, line 6: preprocessing_fn=my_prep:dolly raised KeyError"):
        prep_examples(data, tmp_path / "out2", "byte", seq_len=32, preprocessing_fn="my_prep:dolly")
    with pytest.raises(ExampleError, match=r"preprocessing_fn=my_prep:nothing: cannot import it"):
        prep_examples(data, tmp_path / "out3", "byte", seq_len=32, preprocessing_fn="my_prep:nothing")


def test_an_edited_preprocessing_fn_prepares_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prep cache keys on the function's source, not its name: after an edit (seen by the next process,
    which imports the file anew) the rows are the new function's, not the cached ones of the old."""
    from tessera.llm.finetune.cache import prepared
    from tessera.shards import MDSDataset

    module = tmp_path / "edited_prep.py"
    module.write_text("def rows(r):\n    return {'prompt': r['q'], 'response': ' old'}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"q": f"say {i}"}) + "\n" for i in range(3)))
    options = dict(seq_len=32, cache_root=tmp_path / "cache", preprocessing_fn="edited_prep:rows")
    first, _ = prepared(str(data), "byte", **options)
    assert prepared(str(data), "byte", **options)[0] == first  # unchanged: reused
    module.write_text("def rows(r):\n    return {'prompt': r['q'], 'response': ' the new one'}\n")
    monkeypatch.delitem(sys.modules, "edited_prep")  # a new process imports the edited file
    second, _ = prepared(str(data), "byte", **options)
    assert second != first
    trained = []  # the response bytes and end-of-text of the 3 examples (byte tokenizer)
    for folder in (first, second):
        with MDSDataset(str(folder / "train")) as rows:
            trained.append(sum(int(rows.get(i)["loss_mask"].sum()) for i in range(len(rows))))
    assert trained == [3 * (len(" old") + 1), 3 * (len(" the new one") + 1)]


def test_text_windows_truncate_pad_and_mask(made) -> None:
    """A `text` column as Foundry's text loader makes it: ids cut at seq_len, padded after, padding out of
    the loss (and out of attention_mask); with a transformers tokenizer, its own special tokens."""
    import torch
    from transformers import AutoTokenizer

    from tessera.llm.text_windows import TextWindows
    from tessera.llm.tokenizer import load_tokenizer

    ours = load_tokenizer(made["neox-tok"] / "tokenizer.json")
    short, long = "the fox", " ".join(WORDS * 3)
    batch = TextWindows(ours, 8)({"text": [short, long]})
    ids = ours.encode(short)
    assert len(ids) < 8 and len(ours.encode(long)) > 8
    want = torch.tensor([ids + [ours.eos_id] * (8 - len(ids)), ours.encode(long)[:8]])
    assert torch.equal(batch["tokens"], want)
    assert torch.equal(batch["attention_mask"], torch.tensor([[1] * len(ids) + [0] * (8 - len(ids)), [1] * 8]))
    assert torch.equal(batch["labels"], want.masked_fill(batch["attention_mask"] == 0, -100))
    hf = AutoTokenizer.from_pretrained(made["llama"])
    row = TextWindows(hf, 8)({"text": [short]})
    assert row["tokens"][0, :len(hf(short)["input_ids"])].tolist() == hf(short)["input_ids"]
    assert row["tokens"][0, -1].item() == hf.pad_token_id


def test_decoupled_lionw_is_foundrys_update() -> None:
    """One step of decoupled_lionw: p <- p (1 - wd lr / lr0) - lr sign(b1 m + (1 - b1) g); m <- b2 m + (1 - b2) g."""
    import torch

    from tessera.train.optim import DecoupledLionW

    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    opt = DecoupledLionW([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.01)
    for grad in (torch.tensor([0.3, -0.1, 0.0]), torch.tensor([-0.5, 0.2, 0.4])):
        before, m = p.detach().clone(), opt.state[p].get("exp_avg", torch.zeros(3)).clone()
        p.grad = grad
        opt.step()
        want = before * (1 - 0.01) - 0.1 * torch.sign(0.9 * m + 0.1 * grad)
        assert torch.equal(p.detach(), want)
        assert torch.equal(opt.state[p]["exp_avg"], m.lerp(grad, 1 - 0.99))


def test_learned_positions_are_not_exported_as_alibi() -> None:
    from tessera.llm.export import ExportError
    from tessera.llm.hf.gpt_to_hf import hf_architecture
    from tessera.llm.model import GPTConfig

    with pytest.raises(ExportError, match="model.attn='learned'"):
        hf_architecture(GPTConfig(d_model=16, n_heads=2, n_layers=1, attn="learned"))
