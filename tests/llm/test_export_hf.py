"""`--format hf` exports: transformers and peft load them and give the trained model's logits."""

from __future__ import annotations

import pytest
import torch
from hf_fixtures import tiny_llama
from llm_helpers import small_model
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.llm.export import ExportError
from tessera.llm.hf.config import LoraSpec, PretrainedSpec
from tessera.llm.hf.export import export_hf
from tessera.llm.hf.load import load_hf, load_hf_model
from tessera.llm.hf.lora import add_lora
from tessera.storage import open_store
from tessera.train.checkpoint import CheckpointManager, capture_state
from tessera.train.time import Timestamp

runner = CliRunner()


def save_checkpoint(model, folder, config) -> None:
    with CheckpointManager(folder, async_save=False) as mgr:
        mgr.save(capture_state(model, timestamp=Timestamp(batch=2), config=config))


def perturb_adapters(model) -> None:
    """LoRA's B starts at zero; a trained adapter does not."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama") / "model", seed=5)


@pytest.mark.parametrize("variant", [dict(), dict(n_heads=3, d_model=48), dict(attn="rope"),
                                     dict(attn="rope", tie_embeddings=False, no_bias=False, expansion_ratio=3)])
@pytest.mark.parametrize("lora", [False, True])
def test_gpt_exports_as_the_transformers_architecture_with_its_logits(tmp_path, variant, lora):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(11)  # the run's seed: export redraws the frozen base of a LoRA run from it
    model = small_model(seed=11, **variant)
    if lora:  # frozen base (export redraws it from the seed), trained adapters
        add_lora(model, LoraSpec(rank=4))
        perturb_adapters(model)
    else:  # every weight trained: the biases too (they start at zero)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(std=0.1)
    config = {"model": model.cfg.to_dict(), "lora": LoraSpec(rank=4).model_dump() if lora else None,
              "recipe": {"seed": 11}, "tokenizer": "byte"}
    if lora:  # the base of a LoRA run must be what its seed draws, as in train_run
        torch.manual_seed(11)
        fresh = small_model(seed=11, **variant)
        base_keys = {k.replace(".base_layer", "") for k in model.state_dict() if "lora_" not in k}
        assert base_keys == set(fresh.state_dict())
    save_checkpoint(model, tmp_path / "ckpt", config)
    export_hf(tmp_path / "ckpt", tmp_path / "out")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True).eval()
    x = torch.randint(0, 257, (2, 24))
    torch.testing.assert_close(hf(input_ids=x).logits, model.eval()(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("setting", "key"), [(dict(norm="rmsnorm"), "model.norm"),
                                              (dict(no_bias=False), "model.no_bias"),
                                              (dict(tie_embeddings=False), "model.tie_embeddings")])
def test_gpt_settings_without_an_architecture_are_refused_by_name(tmp_path, setting, key):
    model = small_model(**setting)
    save_checkpoint(model, tmp_path / "ckpt", {"model": model.cfg.to_dict()})
    with pytest.raises(ExportError, match=key):
        export_hf(tmp_path / "ckpt", tmp_path / "out")


def lora_checkpoint(llama, folder):
    spec = LoraSpec(rank=4, alpha=8)
    model, tokenizer = load_hf(PretrainedSpec(pretrained=str(llama)), spec)
    perturb_adapters(model)
    save_checkpoint(model, folder, {"model": {"pretrained": str(llama)}, "lora": spec.model_dump()})
    return model.eval(), tokenizer


def test_hf_lora_merged_and_adapter_only_exports(llama, tmp_path):
    import peft
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = lora_checkpoint(llama, tmp_path / "ckpt")
    res = runner.invoke(app, ["llm", "export", str(tmp_path / "ckpt"), str(tmp_path / "merged"), "--format", "hf"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["llm", "export", str(tmp_path / "ckpt"), str(tmp_path / "adapter"), "--format", "hf",
                              "--adapter-only"])
    assert res.exit_code == 0, res.output
    x = torch.randint(0, 300, (2, 16))
    expected = model(x)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", local_files_only=True).eval()
    torch.testing.assert_close(merged(input_ids=x).logits, expected, atol=1e-4, rtol=1e-4)
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path / "merged", local_files_only=True)
    messages = [{"role": "user", "content": "reverse: a b"}]
    assert loaded_tok.apply_chat_template(messages) == tokenizer.apply_chat_template(messages)
    adapted = peft.PeftModel.from_pretrained(load_hf_model(llama), tmp_path / "adapter").eval()
    torch.testing.assert_close(adapted(input_ids=x).logits, expected, atol=1e-4, rtol=1e-4)
    adapter_bytes = sum(p.stat().st_size for p in (tmp_path / "adapter").iterdir())
    assert adapter_bytes < (tmp_path / "merged" / "model.safetensors").stat().st_size


def test_export_to_a_bucket(llama, tmp_path, s3_bucket):
    from transformers import AutoModelForCausalLM

    model, _ = lora_checkpoint(llama, tmp_path / "ckpt")
    url = export_hf(tmp_path / "ckpt", f"{s3_bucket}/exports/m1")
    store = open_store(url)
    keys = {o.key for o in store.list("")}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= keys
    local = tmp_path / "downloaded"
    for key in keys:
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        (local / key).write_bytes(store.get(key))
    hf = AutoModelForCausalLM.from_pretrained(local, local_files_only=True).eval()
    x = torch.randint(0, 300, (1, 12))
    torch.testing.assert_close(hf(input_ids=x).logits, model(x), atol=1e-4, rtol=1e-4)


def test_adapter_only_needs_lora_and_format_hf(llama, tmp_path):
    model, _ = load_hf(PretrainedSpec(pretrained=str(llama)))
    save_checkpoint(model, tmp_path / "ckpt", {"model": {"pretrained": str(llama)}, "lora": None})
    with pytest.raises(ExportError, match="no lora section"):
        export_hf(tmp_path / "ckpt", tmp_path / "out", adapter_only=True)
    res = runner.invoke(app, ["llm", "export", str(tmp_path / "ckpt"), str(tmp_path / "o"), "--adapter-only"])
    assert res.exit_code != 0 and "--format hf" in res.output


def test_full_fine_tune_of_a_tied_model_exports_every_weight(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    folder = tiny_llama(tmp_path / "tied")
    config = LlamaConfig.from_pretrained(folder)
    config.tie_word_embeddings = True
    LlamaForCausalLM(config).save_pretrained(folder)
    model, _ = load_hf(PretrainedSpec(pretrained=str(folder)))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # every weight "trained", the tied pair together
    save_checkpoint(model, tmp_path / "ckpt", {"model": {"pretrained": str(folder)}, "lora": None})
    export_hf(tmp_path / "ckpt", tmp_path / "out")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True).eval()
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    x = torch.randint(0, 300, (2, 10))
    torch.testing.assert_close(hf(input_ids=x).logits, model.eval()(x), atol=1e-4, rtol=1e-4)


def test_generate_and_eval_read_lora_and_pretrained_checkpoints(llama, prepped, tmp_path):
    torch.manual_seed(11)
    gpt = add_lora(small_model(seed=11), LoraSpec(rank=4))
    perturb_adapters(gpt)
    save_checkpoint(gpt, tmp_path / "gpt", {"model": gpt.cfg.to_dict(), "lora": LoraSpec(rank=4).model_dump(),
                                            "recipe": {"seed": 11}, "tokenizer": "byte"})
    res = runner.invoke(app, ["llm", "generate", str(tmp_path / "gpt"), "--prompt", "def ", "--max-new-tokens", "4",
                              "--greedy", "--json"])
    assert res.exit_code == 0, res.output
    lora_checkpoint(llama, tmp_path / "hf")
    res = runner.invoke(app, ["llm", "eval", str(tmp_path / "hf"), "--data", str(prepped), "--max-batches", "1",
                              "--json"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["llm", "generate", str(tmp_path / "hf"), "--prompt", "hi"])
    assert res.exit_code != 0 and "--format hf" in res.output


def test_gpt_adapter_only_loads_onto_the_exported_mpt_base(tmp_path):
    import peft
    from transformers import AutoModelForCausalLM

    torch.manual_seed(11)
    base = small_model(seed=11)
    save_checkpoint(base, tmp_path / "base-ckpt", {"model": base.cfg.to_dict()})
    export_hf(tmp_path / "base-ckpt", tmp_path / "base")
    torch.manual_seed(11)
    model = add_lora(small_model(seed=11), LoraSpec(rank=4))
    perturb_adapters(model)
    save_checkpoint(model, tmp_path / "ckpt", {"model": model.cfg.to_dict(), "lora": LoraSpec(rank=4).model_dump(),
                                               "recipe": {"seed": 11}})
    export_hf(tmp_path / "ckpt", tmp_path / "adapter", adapter_only=True)
    mpt = AutoModelForCausalLM.from_pretrained(tmp_path / "base", local_files_only=True)
    adapted = peft.PeftModel.from_pretrained(mpt, tmp_path / "adapter").eval()
    x = torch.randint(0, 257, (2, 16))
    torch.testing.assert_close(adapted(input_ids=x).logits, model.eval()(x), atol=1e-4, rtol=1e-4)
    rope = small_model(attn="rope")
    add_lora(rope, LoraSpec(rank=2))
    save_checkpoint(rope, tmp_path / "rope", {"model": rope.cfg.to_dict(), "lora": LoraSpec(rank=2).model_dump()})
    with pytest.raises(ExportError, match="model.attn='alibi'"):
        export_hf(tmp_path / "rope", tmp_path / "rope-adapter", adapter_only=True)


def test_a_tessera_export_with_its_bpe_tokenizer_converts(tmp_path, bpe_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tessera.llm.export import save_pretrained
    from tessera.llm.tokenizer import load_tokenizer

    model = small_model(seed=3, vocab_size=400, attn="rope")
    tok = load_tokenizer(bpe_path)
    save_pretrained(model, tmp_path / "tessera", tokenizer=tok)
    res = runner.invoke(app, ["llm", "export", str(tmp_path / "tessera"), str(tmp_path / "hf"), "--format", "hf"])
    assert res.exit_code == 0, res.output
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert hf_tok("def read(self)")["input_ids"] == tok.encode("def read(self)")
    x = torch.randint(0, 400, (1, 12))
    torch.testing.assert_close(hf(input_ids=x).logits, model(x), atol=1e-4, rtol=1e-4)
