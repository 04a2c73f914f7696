"""Composer checkpoints and HF-converted MPT folders load into Tessera's GPT with the MPT's own logits.

The MPT is transformers' own (MptConfig/MptForCausalLM, random weights, nothing downloaded). The Composer
file is what Composer's `_save_checkpoint` writes for an LLM Foundry run (composer/utils/checkpoint.py,
composer/core/state.py): `torch.save({"state": {...}, "rng": [...]})`, the model under HuggingFaceModel's
`model.` prefix with Foundry's MPT names, the optimizer state from torch's `get_optimizer_state_dict`
(keyed by parameter name), the timestamp as `Timestamp.state_dict()` (timedeltas in it), the MPT config
and tokenizer files in `integrations.huggingface`, numpy arrays in the RNG states.
"""

from __future__ import annotations

import datetime
import json
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_fixtures import chat_tokenizer
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.hf.composer import ComposerCheckpointError, read_composer_checkpoint
from tessera.llm.hf.composer_start import composer_load_path, composer_trainer_config
from tessera.llm.hf.mpt import MptUnsupported, gpt_config_from_mpt, gpt_names
from tessera.llm.hf.mpt_load import load_gpt
from tessera.llm.model import GPT, GPTConfig
from tessera.llm.model_source import NotAModel
from tessera.storage import upload
from tessera.train.checkpoint import CheckpointManager, apply_state
from tessera.train.config import TrainerConfig
from tessera.train.optim import DecoupledAdamW
from tessera.train.time import Timestamp

runner = CliRunner()
VOCAB = 320  # chat_tokenizer's


def tiny_mpt(seed: int = 0, **overrides):
    """transformers' MPT with every weight drawn at random (norms too), so any wrong mapping shows."""
    from transformers import MptConfig, MptForCausalLM

    torch.manual_seed(seed)
    config = MptConfig(**{"d_model": 32, "n_heads": 4, "n_layers": 2, "max_seq_len": 64, "vocab_size": VOCAB,
                          **overrides})
    model = MptForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def foundry_config(hf_model) -> dict:
    """The MPT config as Foundry's MPTConfig writes it (its key names and defaults, filled in)."""
    c = hf_model.config
    return {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": c.d_model, "n_heads": c.n_heads,
            "n_layers": c.n_layers, "expansion_ratio": 4, "max_seq_len": c.max_seq_len, "vocab_size": c.vocab_size,
            "resid_pdrop": 0.0, "emb_pdrop": 0.0, "learned_pos_emb": False, "head_dim": None,
            "attn_config": {"attn_type": "multihead_attention", "attn_pdrop": 0.0, "attn_impl": "flash", "qk_ln": False,
                            "qk_gn": False, "fused_qkv": True, "clip_qkv": None, "softmax_scale": None,
                            "attn_uses_sequence_id": False, "sliding_window_size": -1, "attn_logit_softcapping": None,
                            "alibi": True, "alibi_bias_max": 8, "rope": False, "nope": False, "rope_theta": 10000,
                            "rope_impl": "dail", "rope_dail_config": {"type": "original", "pos_idx_in_fp32": True,
                                                                      "xpos_scale_base": 512},
                            "rope_hf_config": {"type": "no_scaling", "factor": 1.0},
                            "attn_temperature_tuning": {"floor_scale": 8192, "attn_scale": 0.0}, "kv_dim": None},
            "ffn_config": {"ffn_type": "mptmlp", "fc_type": {"name": "torch"}}, "init_device": "cpu",
            "logit_scale": None, "no_bias": True, "attention_bias": False, "embedding_fraction": 1.0,
            "norm_type": "low_precision_layernorm", "norm_eps": 1e-05, "use_cache": False,
            "init_config": {"name": "kaiming_normal_", "fan_mode": "fan_in", "init_nonlinearity": "relu"},
            "fc_type": {"name": "torch"}, "tie_word_embeddings": True, "use_pad_tok_in_ffn": True,
            "block_overrides": None, "final_logit_softcapping": None}


class ComposerModel(torch.nn.Module):
    """Composer's HuggingFaceModel as far as names go: the MPT is its `.model`."""

    def __init__(self, hf) -> None:
        super().__init__()
        self.model = hf


def tokenizer_metadata(tokenizer) -> dict:
    """HuggingFaceModel.get_metadata's tokenizer part: each saved file's contents, by extension."""
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        for path in Path(tmp).iterdir():
            content = json.loads(path.read_text()) if path.suffix == ".json" else path.read_text().split("\n")
            files[path.name] = {"file_extension": path.suffix, "content": content}
    return files


def train_steps(hf, opt, steps: int, seed: int = 3) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (4, 12), generator=gen)
        hf(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()


def composer_state(hf, opt=None, tokenizer=None, batch: int = 2) -> dict:
    """The dict Composer's `_save_checkpoint` torch.saves (weights only without `opt`)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    wrapper = ComposerModel(hf)
    model = {k: v.detach().clone() for k, v in wrapper.state_dict().items() if k != "model.lm_head.weight"}
    hf_meta = {"model": {"config": {"file_extension": ".json", "content": foundry_config(hf),
                                    "class": "llmfoundry.models.mpt.modeling_mpt.MPTForCausalLM"}},
               "tokenizer": tokenizer_metadata(tokenizer) if tokenizer is not None else {}}
    metadata = {"composer_env_info": {"composer_version": "0.32.1"}, "torch_version": torch.__version__,
                "device": "gpu", "precision": "amp_bf16", "world_size": 2, "device_train_microbatch_size": 2,
                "train_dataloader_batch_size": 4}
    state = {"model": model, "integrations": {"huggingface": hf_meta}, "metadata": metadata}
    if opt is None:
        return {"state": state}
    wct = datetime.timedelta(seconds=12.5)
    optim = get_optimizer_state_dict(wrapper, opt)
    for group in optim["param_groups"]:  # Composer's DecoupledAdamW keeps the decay itself as weight_decay
        group["weight_decay"] = group.pop("decay_per_unit_lr_schedule")
        group.pop("decoupled_weight_decay")
    state.update({
        "optimizers": {"DecoupledAdamW": optim},
        "schedulers": {"LambdaLR": {"base_lrs": [1e-2], "last_epoch": batch}}, "algorithms": [],
        "callbacks": {"SpeedMonitor": {"total_eval_wct": 0.0}}, "scaler": {"GradScaler": {}},
        "timestamp": {"Timestamp": {"iteration": 0, "epoch": 0, "batch": batch, "sample": 4 * batch, "token": 48 * batch,
                                    "epoch_in_iteration": 0, "token_in_iteration": 48 * batch,
                                    "batch_in_epoch": batch, "sample_in_epoch": 4 * batch, "token_in_epoch": 48 * batch,
                                    "total_wct": wct, "iteration_wct": wct, "epoch_wct": wct, "batch_wct": wct}},
        "rank_zero_seed": 17, "run_name": "mpt-tiny",
        "train_metrics": {"LanguageCrossEntropy": {"state_dict": {"sum_loss": torch.tensor(3.0)}, "_computed": None}},
        "dataset_state": {"train": {"epoch": 0, "sample_in_epoch": 4 * batch, "num_canonical_nodes": 1,
                                    "shuffle_seed": 9176, "initial_physical_nodes": None}, "eval": {}}})
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    return {"state": state, "rng": [rng, rng]}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny MPT trained 2 steps with DecoupledAdamW, saved as Composer does (and its tokenizer)."""
    folder = tmp_path_factory.mktemp("composer")
    hf = tiny_mpt().train()
    opt = DecoupledAdamW(hf.parameters(), lr=1e-2, weight_decay=1e-4)  # Composer's update rule (train/optim.py)
    train_steps(hf, opt, 2)
    tokenizer = chat_tokenizer()
    torch.save(composer_state(hf, opt, tokenizer), folder / "ep0-ba2-rank0.pt")
    return {"hf": hf.eval(), "opt": opt, "ckpt": folder / "ep0-ba2-rank0.pt", "tokenizer": tokenizer}


def logits_match(gpt: GPT, hf) -> None:
    ids = torch.randint(0, hf.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids), hf(input_ids=ids).logits, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"d_model": 24, "n_heads": 3, "tie_word_embeddings": False}])
def test_an_hf_mpt_folder_loads_with_its_logits(tmp_path, overrides):
    hf = tiny_mpt(seed=5, **overrides)
    hf.save_pretrained(tmp_path / "mpt")
    gpt, tokenizer = load_gpt(tmp_path / "mpt")
    assert tokenizer is None and gpt.cfg.tie_embeddings == hf.config.tie_word_embeddings
    logits_match(gpt, hf)


def test_a_composer_checkpoint_loads_with_its_logits_and_tokenizer(run):
    gpt, tokenizer = load_gpt(run["ckpt"])
    logits_match(gpt, run["hf"])
    assert tokenizer("reverse: data model")["input_ids"] == run["tokenizer"]("reverse: data model")["input_ids"]
    ckpt = read_composer_checkpoint(str(run["ckpt"]))
    assert (ckpt.optimizer_name, ckpt.weights_only, ckpt.global_batch_size) == ("DecoupledAdamW", None, 8)
    assert ckpt.timestamp == Timestamp(batch=2, sample=8, token=96, batch_in_epoch=2, sample_in_epoch=8,
                                       token_in_epoch=96)


def test_model_pretrained_reads_a_composer_file_once_for_its_description(run, tmp_path, monkeypatch):
    """`model.pretrained=<Composer file>`: the tokenizer and the sequence length a run asks for first come
    from one read of the file, and no model is built for them; the model itself is the second read."""
    from tessera.llm.hf import mpt_load
    from tessera.llm.hf.config import PretrainedSpec
    from tessera.llm.hf.load import load_pretrained_model, pretrained_seq_len, pretrained_tokenizer

    path = tmp_path / "ep0-ba2-rank0.pt"
    path.write_bytes(run["ckpt"].read_bytes())
    reads, built = [], []
    real_read, real_gpt = mpt_load.read_composer_checkpoint, mpt_load.empty_gpt
    monkeypatch.setattr(mpt_load, "read_composer_checkpoint", lambda *a: reads.append(a) or real_read(*a))
    monkeypatch.setattr(mpt_load, "empty_gpt", lambda cfg: built.append(cfg) or real_gpt(cfg))
    spec = PretrainedSpec(pretrained=str(path))
    tokenizer = pretrained_tokenizer(spec)
    assert pretrained_seq_len(spec) == 64 and (len(reads), len(built)) == (1, 0)
    assert tokenizer.get_vocab() == run["tokenizer"].get_vocab()
    model, _ = load_pretrained_model(spec)
    assert (len(reads), len(built)) == (2, 1)
    logits_match(model.eval(), run["hf"])


def test_a_composer_run_continues_in_tessera_as_it_would_have_in_composer(run, tmp_path, monkeypatch):
    """One more step from the converted checkpoint gives the weights one more step of the MPT gives."""
    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path))
    start = composer_load_path(str(run["ckpt"]), cache_dir=tmp_path)
    assert start.weights_only is None and composer_load_path(str(run["ckpt"]), cache_dir=tmp_path) == start
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 1  # converted once
    cfg = composer_trainer_config(TrainerConfig(max_duration="3ba", load_path=str(run["ckpt"])))
    assert cfg.load_path == start.url
    gpt = GPT(gpt_config_from_mpt(foundry_config(run["hf"]), "test"))
    opt = DecoupledAdamW(gpt.parameters(), lr=5.0, weight_decay=0.5)  # the saved hyperparameters win
    with CheckpointManager(start.url) as manager:
        state = manager.load(start.url)
    apply_state(state, gpt, [opt], restore_rng=False)
    assert Timestamp.from_state_dict(state["timestamp"]).batch == 2 and state["config"]["global_batch_size"] == 8
    hf, hf_opt = run["hf"].train(), run["opt"]
    hf_before = {k: v.clone() for k, v in hf.state_dict().items()}
    try:
        train_steps(hf, hf_opt, 1, seed=9)
        gen = torch.Generator().manual_seed(9)
        ids = torch.randint(0, VOCAB, (4, 12), generator=gen)
        torch.nn.functional.cross_entropy(gpt.train()(ids)[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).backward()
        opt.step()
        stepped = hf.state_dict()
        for name, value in gpt.state_dict().items():
            torch.testing.assert_close(value, stepped[name], atol=1e-5, rtol=1e-4, msg=name)
    finally:
        hf.load_state_dict(hf_before)
        hf.eval()


def test_a_run_that_autoresumes_converts_nothing(run, tmp_path, monkeypatch):
    """A save folder with the run's own committed checkpoint: autoresume takes it and load_path goes unused,
    so the Composer file is not converted; another run's checkpoints there leave the start to load_path."""
    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path / "cache"))
    with CheckpointManager(tmp_path / "ck", "mine", async_save=False) as manager:
        manager.save({"model": {"w": torch.zeros(1)}, "timestamp": Timestamp(batch=1).state_dict(),
                      "config": {"run_name": "mine"}})
    config = TrainerConfig(max_duration="3ba", load_path=str(run["ckpt"]), autoresume=True,
                           save_folder=str(tmp_path / "ck"), run_name="mine")
    assert composer_trainer_config(config) == config and not (tmp_path / "cache").exists()
    other = composer_trainer_config(config.model_copy(update={"run_name": "other"}))
    assert other.load_path == composer_load_path(str(run["ckpt"])).url  # converted: the run starts from it
    assert len([p for p in (tmp_path / "cache").iterdir() if p.name.startswith("composer-")]) == 1


def test_a_weights_only_checkpoint_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path / "cache"))
    hf = tiny_mpt(seed=2)
    torch.save(composer_state(hf), tmp_path / "weights.pt")
    start = composer_load_path(str(tmp_path / "weights.pt"), cache_dir=tmp_path / "cache")
    assert start.weights_only == "the checkpoint holds no optimizer state (a weights-only save)"
    with pytest.warns(UserWarning, match="only the weights carry over: the checkpoint holds no optimizer"):
        cfg = composer_trainer_config(TrainerConfig(max_duration="3ba", load_path=str(tmp_path / "weights.pt")))
    assert cfg.load_weights_only and cfg.load_path == start.url


def test_export_hands_a_composer_checkpoint_back_to_transformers(run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    res = runner.invoke(app, ["llm", "export", str(run["ckpt"]), str(tmp_path / "hf"), "--format", "hf"])
    assert res.exit_code == 0, res.output
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids).logits, run["hf"](input_ids=ids).logits, atol=2e-5, rtol=1e-5)
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").get_vocab() == run["tokenizer"].get_vocab()


@pytest.mark.s3
def test_a_composer_checkpoint_in_a_bucket(run, s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path))  # where the object is downloaded
    url = f"{s3_bucket}/foundry/checkpoints/ep0-ba2-rank0.pt"
    upload(run["ckpt"], url)
    gpt, _ = load_gpt(url)
    logits_match(gpt, run["hf"])


@pytest.mark.parametrize("change, named", [
    ({"attn_config": {"alibi": True, "qk_ln": True}}, "attn_config.qk_ln"),
    ({"attn_config": {"alibi": True, "clip_qkv": 6}}, "attn_config.clip_qkv=6"),
    ({"attn_config": {"alibi": True, "attn_type": "grouped_query_attention", "kv_n_heads": 2}}, "kv_n_heads=2"),
    ({"ffn_config": {"ffn_type": "mptglu"}}, "ffn_config.ffn_type=mptglu"),
    ({"logit_scale": "inv_sqrt_d_model"}, "logit_scale=inv_sqrt_d_model"),
    ({"expansion_ratio": 2.5}, "FFN hidden size of 80"),
    ({"model_type": "llama"}, "model_type 'llama' is not MPT"),
])
def test_what_the_gpt_cannot_compute_is_refused_naming_it(change, named):
    config = {"d_model": 32, "n_heads": 4, "n_layers": 1, **change}
    with pytest.raises(MptUnsupported) as info:
        gpt_config_from_mpt(config, "ckpt.pt")
    assert str(info.value).startswith("ckpt.pt: ") and named in str(info.value) and "\n" not in str(info.value)


def test_foundry_positions_norms_and_split_qkv_map():
    base = {"d_model": 32, "n_heads": 4, "n_layers": 1, "vocab_size": 50}
    rope = gpt_config_from_mpt({**base, "attn_config": {"rope": True, "rope_theta": 500000, "rope_impl": "hf"},
                                "norm_type": "rmsnorm", "no_bias": False}, "x")
    assert (rope.attn, rope.rope_theta, rope.norm, rope.no_bias) == ("rope", 500000.0, "rmsnorm", False)
    assert gpt_config_from_mpt(base, "x").attn == "learned"  # Foundry's default: learned_pos_emb
    gpt = GPT(GPTConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=50, max_seq_len=16))
    foundry = {}  # fused_qkv: false and fuse_norm_attn_norm: true, under Composer's prefix
    for name, value in gpt.state_dict().items():
        name = name.replace(".norm_1.", ".norm_attn_norm.norm_1.").replace(".attn.", ".norm_attn_norm.attn.")
        if name.endswith("Wqkv.weight"):
            for part, rows in zip(("Wq", "Wk", "Wv"), value.chunk(3), strict=True):
                foundry[f"model.{name.replace('Wqkv', part)}"] = rows
        else:
            foundry[f"model.{name}"] = value
    renamed = gpt_names(foundry, "model.")
    assert renamed.keys() == gpt.state_dict().keys()
    assert all(torch.equal(renamed[k], v) for k, v in gpt.state_dict().items())


def foreign_files(folder: Path, real: Path) -> dict[str, Path]:
    data = real.read_bytes()
    files = {"truncated": data[: len(data) // 2], "not-composer": None, "pickled-object": None}
    for name, content in files.items():
        if content is not None:
            (folder / f"{name}.pt").write_bytes(content)
    torch.save({"transformer.wte.weight": torch.zeros(2, 2)}, folder / "not-composer.pt")
    torch.save({"state": {"model": {}}, "extra": Timestamp(batch=1)}, folder / "pickled-object.pt")
    return {name: folder / f"{name}.pt" for name in files}


def test_a_damaged_or_foreign_checkpoint_is_one_line(run, tmp_path):
    expected = {"truncated": "not a readable torch checkpoint (damaged or truncated?)",
                "not-composer": "not a Composer checkpoint: it has no state.model (it holds transformer.wte.weight)",
                "pickled-object": "holds a pickled tessera.train.time.Timestamp object"}
    for name, path in foreign_files(tmp_path, run["ckpt"]).items():
        with pytest.raises(ComposerCheckpointError) as info:
            read_composer_checkpoint(str(path))
        assert str(info.value).startswith(f"{path}: ") and expected[name] in str(info.value), str(info.value)
        res = runner.invoke(app, ["llm", "export", str(path), str(tmp_path / name), "--format", "hf"])
        assert res.exit_code == 1 and res.output.count("\n") == 1 and expected[name] in res.output, res.output


def test_tessera_train_continues_from_a_composer_load_path(run, tmp_path, monkeypatch):
    """`load_path:` naming Composer's file: the run starts at its batch 2 with its weights and data position."""
    from llm_helpers import write_text_corpus

    monkeypatch.setenv("TESSERA_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.chdir(tmp_path)
    write_text_corpus(tmp_path / "corpus", 24)
    res = runner.invoke(app, ["llm", "prep", "corpus", "mds", "--tokenizer", "byte", "--seq-len", "64",
                              "--val-fraction", "0.2"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["train", "tiny-cpu.yaml", f"load_path={run['ckpt']}", "data.train.streams.0.remote=mds",
                              "data.eval.streams.0.remote=mds", "model.d_model=32", "model.n_layers=2",
                              "model.max_seq_len=64", "model.vocab_size=320", "global_train_batch_size=8",
                              "device_train_microbatch_size=8", "max_duration=3ba", "save_folder=ck", "log_interval=1ba",
                              "loggers=[jsonl]", "torch_threads=1", "data.train.num_canonical_nodes=1"])
    assert res.exit_code == 0, res.output[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "logs" / "tiny-cpu" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [3]  # batches 1 and 2 were Composer's
    with CheckpointManager("ck") as manager:
        saved = manager.load("ck")
    assert Timestamp.from_state_dict(saved["timestamp"]).sample == 16 and saved["dataloader"]["sample_in_epoch"] == 16
    moved = (saved["model"]["transformer.wte.weight"] - run["hf"].transformer.wte.weight).abs().max()
    assert 0 < moved < 0.02  # one Adam step of lr 1e-2 (the saved group's) from Composer's weights
    res = runner.invoke(app, ["train", "tiny-cpu.yaml", f"load_path={run['ckpt']}", "model.d_model=32", "model.n_layers=3",
                              "model.max_seq_len=64", "model.vocab_size=320", "data.train.streams.0.remote=mds",
                              "data.eval.streams.0.remote=mds", "save_folder=ck3"])
    assert res.exit_code == 1 and res.output == (f"error: load_path={run['ckpt']}: the checkpoint's model differs from "
                                                 "the run's: model.n_layers is 3 here, 2 there\n"), res.output


def test_a_sharded_composer_checkpoint_is_refused_with_how_to_convert_it(tmp_path):
    """DCP's metadata is a pickle (reading it runs code): refused in one line that says how to convert it."""
    import torch.distributed.checkpoint as dcp

    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"state": {"model": {"model.transformer.wte.weight": torch.zeros(2, 2)}}},
                 checkpoint_id=tmp_path / "ep0-ba2")
    with pytest.raises(NotAModel, match=r"ep0-ba2: a sharded Composer checkpoint .* dcp_to_torch FOLDER"):
        load_gpt(tmp_path / "ep0-ba2")
    with pytest.raises(ComposerCheckpointError, match=r"^load_path=.*ep0-ba2: a sharded Composer checkpoint"):
        composer_trainer_config(TrainerConfig(max_duration="1ba", load_path=str(tmp_path / "ep0-ba2")))
