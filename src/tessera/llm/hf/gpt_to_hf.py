"""Tessera's GPT as the transformers architecture whose maths it matches, with the same logits.

    hf_model = gpt_to_hf(model)          # MptForCausalLM or GPTNeoXForCausalLM, weights copied
    hf_model.save_pretrained("out")      # then AutoModelForCausalLM.from_pretrained("out")

- ALiBi -> MPT: the GPT follows MPT's layout and names (fused Wqkv, GELU MLP, LayerNorm without bias,
  tied output layer), so the weights copy one to one. transformers' MPT biases attention by distance to
  the last key rather than to the query; the difference is a constant per query row, which the softmax
  removes. It has no biases and a 4x MLP, so `no_bias`, `expansion_ratio` and `tie_embeddings` must be
  MPT's.
- RoPE -> GPT-NeoX with full rotary dimensions and sequential residuals (`use_parallel_residual=False`):
  the same rotate-half RoPE, GELU MLP and LayerNorm. Its fused QKV is laid out per head ([q, k, v] of
  head 0, then head 1...), so the rows are regrouped; the biases it always has are zero when the GPT
  has none.
- RMSNorm has no counterpart in either (Llama has RMSNorm but a SwiGLU MLP): refused, naming the key.
"""

from __future__ import annotations

from typing import Any

import torch

from tessera.llm.export import ExportError
from tessera.llm.model import GPT, GPTConfig


def hf_architecture(cfg: GPTConfig) -> str:
    """"mpt" or "gpt_neox" for a GPT config; ExportError naming the setting that has no match."""
    if cfg.norm != "layernorm":
        raise ExportError(f"model.norm={cfg.norm!r} has no transformers architecture with the same maths "
                          "(MPT and GPT-NeoX use LayerNorm; Llama's RMSNorm comes with a SwiGLU MLP); "
                          "export with --format tessera")
    if cfg.attn == "rope":
        return "gpt_neox"
    if cfg.attn == "learned":
        raise ExportError("model.attn='learned' (MPT's learned position table) has no transformers architecture "
                          "with the same maths here (transformers' MPT is ALiBi only); export with --format tessera")
    for key, value, mpt in (("no_bias", cfg.no_bias, True), ("expansion_ratio", cfg.expansion_ratio, 4),
                            ("tie_embeddings", cfg.tie_embeddings, True)):
        if value != mpt:
            raise ExportError(f"model.{key}={value!r}: transformers' MPT (the ALiBi architecture) needs "
                              f"{key}={mpt!r}; export with --format tessera")
    return "mpt"


def hf_config(cfg: GPTConfig) -> Any:
    """The transformers config of the architecture `hf_architecture` picks."""
    if hf_architecture(cfg) == "mpt":
        from transformers import MptConfig

        return MptConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers, expansion_ratio=4,
                         max_seq_len=cfg.max_seq_len, vocab_size=cfg.vocab_size, layer_norm_epsilon=cfg.norm_eps,
                         no_bias=True, attn_config={"alibi": True, "alibi_bias_max": cfg.alibi_bias_max},
                         initializer_range=cfg.init_std, tie_word_embeddings=True)
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                         num_attention_heads=cfg.n_heads, intermediate_size=cfg.expansion_ratio * cfg.d_model,
                         hidden_act="gelu", rotary_pct=1.0, rotary_emb_base=cfg.rope_theta,
                         max_position_embeddings=cfg.max_seq_len, layer_norm_eps=cfg.norm_eps,
                         use_parallel_residual=False, tie_word_embeddings=cfg.tie_embeddings,
                         attention_bias=not cfg.no_bias, initializer_range=cfg.init_std,
                         bos_token_id=None, eos_token_id=None)


def neox_qkv(tensor: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Tessera's fused QKV rows [q | k | v] regrouped per head as GPT-NeoX reads them."""
    rest = tensor.shape[1:]
    return tensor.reshape(3, n_heads, -1, *rest).transpose(0, 1).reshape(-1, *rest)


def neox_state(model: GPT) -> dict[str, torch.Tensor]:
    """The GPT's weights under GPT-NeoX's names (biases the GPT lacks are left for the caller to zero)."""
    cfg, src = model.cfg, model.state_dict()
    out = {"gpt_neox.embed_in.weight": src["transformer.wte.weight"],
           "embed_out.weight": src["transformer.wte.weight"] if cfg.tie_embeddings else src["lm_head.weight"]}
    names = {"norm_1": "input_layernorm", "norm_2": "post_attention_layernorm", "attn.Wqkv": "attention.query_key_value",
             "attn.out_proj": "attention.dense", "ffn.up_proj": "mlp.dense_h_to_4h",
             "ffn.down_proj": "mlp.dense_4h_to_h"}
    for i in range(cfg.n_layers):
        for ours, theirs in names.items():
            for kind in ("weight", "bias"):
                value = src.get(f"transformer.blocks.{i}.{ours}.{kind}")
                if value is not None:
                    out[f"gpt_neox.layers.{i}.{theirs}.{kind}"] = (neox_qkv(value, cfg.n_heads)
                                                                   if ours == "attn.Wqkv" else value)
    for kind in ("weight", "bias"):
        if f"transformer.norm_f.{kind}" in src:
            out[f"gpt_neox.final_layer_norm.{kind}"] = src[f"transformer.norm_f.{kind}"]
    return out


def gpt_to_hf(model: GPT) -> Any:
    """A transformers model (in eval mode) with the GPT's weights and the same logits."""
    from transformers import AutoModelForCausalLM

    config = hf_config(model.cfg)
    torch_state = torch.random.get_rng_state()  # the init below must not move the caller's RNG
    try:
        hf = AutoModelForCausalLM.from_config(config)
    finally:
        torch.random.set_rng_state(torch_state)
    weights = ({k: v for k, v in model.state_dict().items()} if hf_architecture(model.cfg) == "mpt"
               else neox_state(model))
    target = hf.state_dict()
    unknown = sorted(set(weights) - set(target))
    if unknown:
        raise ExportError(f"internal: no place for {unknown[:3]} in {type(hf).__name__}")
    with torch.no_grad():
        for key, value in target.items():
            if key in weights:
                value.copy_(weights[key])
            elif key.endswith(".bias"):
                value.zero_()  # a bias the GPT does not have
            elif not (key == "lm_head.weight" and model.cfg.tie_embeddings):
                raise ExportError(f"internal: {type(hf).__name__} weight {key} has no GPT counterpart")
    hf.tie_weights()
    return hf.eval()
