"""The MPT-style model: shapes, causality, ALiBi/RoPE, tied weights, KV cache, init, accounting."""

from __future__ import annotations

import math

import pytest
import torch
from llm_helpers import small_config, small_model

from tessera.llm.generate import filter_logits, generate
from tessera.llm.model import GPT, NAMED_CONFIGS, GPTConfig, alibi_slopes

VARIANTS = [dict(attn="alibi", norm="layernorm"), dict(attn="rope", norm="rmsnorm"),
            dict(attn="alibi", norm="rmsnorm", no_bias=False, tie_embeddings=False),
            dict(attn="rope", norm="layernorm", no_bias=False), dict(attn="learned", norm="layernorm", no_bias=False)]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_shapes_and_initial_loss(variant):
    model = small_model(**variant)
    tokens = torch.randint(0, 257, (3, 20))
    assert model(tokens).shape == (3, 20, 257)
    loss = model({"tokens": tokens})
    assert loss.shape == () and abs(loss.item() - math.log(257)) < 0.5  # near uniform at init
    assert torch.allclose(loss, model.loss({"tokens": tokens}))
    assert torch.allclose(loss, model(tokens[:, :-1], targets=tokens[:, 1:]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("attn", ["alibi", "rope", "learned"])
def test_future_tokens_do_not_change_past_logits(attn):
    model = small_model(attn=attn)
    a = torch.randint(0, 257, (2, 24))
    b = a.clone()
    b[:, 12:] = torch.randint(0, 257, (2, 12))
    la, lb = model(a), model(b)
    assert torch.equal(la[:, :12], lb[:, :12])
    assert not torch.allclose(la[:, 12:], lb[:, 12:])


def test_alibi_and_rope_differ_and_position_matters():
    alibi, rope, learned = small_model(attn="alibi"), small_model(attn="rope"), small_model(attn="learned")
    tokens = torch.randint(0, 257, (1, 16))
    assert not torch.allclose(alibi(tokens), rope(tokens))
    for model in (alibi, rope, learned):  # order must matter (through attention, or the learned table)
        swapped = tokens.clone()
        swapped[0, [0, 1]] = swapped[0, [1, 0]]
        assert not torch.allclose(model(tokens)[0, -1], model(swapped)[0, -1])


def test_alibi_slopes_match_mpt():
    assert torch.allclose(alibi_slopes(8), 1 / 2 ** torch.arange(1, 9, dtype=torch.float32))
    twelve = alibi_slopes(12)  # not a power of two: odd then even slopes of the 16-head set
    sixteen = alibi_slopes(16)
    assert torch.allclose(twelve, torch.cat([sixteen[1::2], sixteen[::2]])[:12])


def test_tied_embeddings():
    tied, untied = small_model(), small_model(tie_embeddings=False)
    assert tied.lm_head is None and "lm_head.weight" not in tied.state_dict()
    assert untied.lm_head is not None
    assert untied.num_params() - tied.num_params() == 257 * 32
    x = torch.randint(0, 257, (1, 5))
    seen = []
    tied.transformer.norm_f.register_forward_hook(lambda m, i, o: seen.append(o))
    logits = tied(x)  # the output layer is the embedding matrix
    assert torch.allclose(logits, seen[0] @ tied.transformer.wte.weight.T, atol=1e-6)
    tied.train()
    tied({"tokens": x}).backward()
    assert tied.transformer.wte.weight.grad is not None


def test_ignore_index_labels():
    model = small_model()
    tokens = torch.randint(0, 257, (2, 10))
    labels = tokens.clone()
    labels[:, :5] = -100
    full = model(tokens[:, :-1])
    expected = torch.nn.functional.cross_entropy(full[:, 4:].reshape(-1, 257), tokens[:, 5:].reshape(-1))
    assert torch.allclose(model({"tokens": tokens, "labels": labels}), expected, atol=1e-6)


def test_residual_projections_get_scaled_init():
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=256, n_heads=4, n_layers=8, vocab_size=300, max_seq_len=32))
    block = model.transformer.blocks[0]
    assert abs(block.attn.Wqkv.weight.std().item() - 0.02) < 0.002
    assert abs(block.ffn.down_proj.weight.std().item() - 0.02 / math.sqrt(16)) < 0.0005
    assert torch.all(block.norm_1.weight == 1)


@pytest.mark.parametrize("attn", ["alibi", "rope", "learned"])
def test_kv_cache_matches_full_forward(attn):
    model = small_model(attn=attn)
    tokens = torch.randint(0, 257, (2, 30))
    full = model(tokens)
    cache = model.new_kv_cache(2)
    parts = [model(tokens[:, :17], kv_cache=cache)] + [model(tokens[:, i:i + 1], kv_cache=cache) for i in range(17, 30)]
    assert cache.pos == 30
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


@pytest.mark.parametrize("attn", ["alibi", "rope", "learned"])
def test_greedy_generation_same_with_and_without_cache(attn):
    model = small_model(seed=3, attn=attn)
    prompt = [5, 17, 99, 3]
    with_cache = generate(model, prompt, 40, greedy=True)
    without = generate(model, prompt, 40, greedy=True, use_cache=False)
    assert len(with_cache) == 40 and with_cache == without


def test_sampling_is_seeded_and_filters_work():
    model = small_model(seed=1)
    a = generate(model, [1, 2], 20, temperature=1.0, top_k=10, top_p=0.9, seed=7)
    assert a == generate(model, [1, 2], 20, temperature=1.0, top_k=10, top_p=0.9, seed=7)
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.isfinite(filter_logits(logits, top_k=2)).tolist() == [[True, True, False, False, False]]
    probs = logits.softmax(-1)[0]  # 0.64, 0.24, ...: p=0.7 keeps the two tokens needed to reach it
    assert probs[0] < 0.7 < probs[0] + probs[1]
    assert torch.isfinite(filter_logits(logits, top_p=0.7)).tolist() == [[True, True, False, False, False]]
    assert generate(model, [1], 5, greedy=True, eos_id=generate(model, [1], 1, greedy=True)[0]) == \
        generate(model, [1], 1, greedy=True)  # stops at EOS


def test_generation_beyond_the_window():
    model = small_model(max_seq_len=16)
    assert len(generate(model, list(range(10)), 30, greedy=True)) == 30
    assert len(generate(model, list(range(10)), 30, greedy=True, use_cache=False)) == 30


def test_sequence_longer_than_window_is_refused():
    with pytest.raises(ValueError, match="max_seq_len"):
        small_model(max_seq_len=8)(torch.zeros(1, 9, dtype=torch.long))


def test_named_configs_on_meta_device():
    with torch.device("meta"):
        big = GPT(GPTConfig.named("mpt-7b"))
        tiny = GPT(GPTConfig.named("tiny"))
    assert 6.5e9 < big.num_params() < 6.8e9
    assert 1e6 < tiny.num_params() < 10e6
    n, cfg = big.num_params(), big.cfg
    assert big.flops_per_token(2048) == 6 * n + 12 * cfg.n_layers * cfg.d_model * 2048
    assert big.flops_per_token() == big.flops_per_token(cfg.max_seq_len)
    assert set(NAMED_CONFIGS) == {"tiny", "mpt-125m", "mpt-350m", "mpt-1b", "mpt-3b", "mpt-7b"}


def test_config_validation():
    with pytest.raises(ValueError, match="did you mean 'n_layers'"):
        GPTConfig.from_dict({"n_layer": 2})
    with pytest.raises(ValueError, match="did you mean 'mpt-7b'"):
        GPTConfig.named("mpt-7")
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="alibi"):
        GPTConfig(attn="flash")
    cfg = GPTConfig.named("tiny", n_layers=2, vocab_size=257)
    assert cfg.n_layers == 2 and cfg.d_model == 256
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg


def test_a_few_steps_overfit_one_batch():
    model = small_model(seed=0).train()
    tokens = torch.randint(0, 257, (4, 33))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model({"tokens": tokens}).item()
    for _ in range(30):
        loss = model({"tokens": tokens})
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 1.0


def test_dropout_only_in_training():
    model = small_model(dropout=0.5)
    tokens = torch.randint(0, 257, (1, 8))
    assert torch.equal(model(tokens), model(tokens))
    model.train()
    assert not torch.equal(model(tokens), model(tokens))


def test_small_config_helper_is_valid():
    assert small_config().head_dim == 8


@pytest.mark.parametrize("attn", ["alibi", "rope", "learned"])
def test_meta_build_then_materialize(attn):
    """Large models are built on meta, moved with to_empty (e.g. under FSDP) and initialized there."""
    with torch.device("meta"):
        model = GPT(small_config(attn=attn))
    model.to_empty(device="cpu")
    model.init_weights()
    reference = small_model(attn=attn)
    for (name, a), (_, b) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
        assert torch.equal(a, b), name
    assert abs(model.transformer.wte.weight.std().item() - 0.02) < 0.005
    assert torch.isfinite(model(torch.randint(0, 257, (1, 8)))).all()
