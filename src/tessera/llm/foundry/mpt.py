"""LLM Foundry's `mpt_causal_lm` as Tessera's GPT (llm/model.py), which follows MPT's layout and names.

    model: {name: mpt_causal_lm, d_model: 768, n_heads: 12, n_layers: 12, expansion_ratio: 4,
            max_seq_len: 2048, vocab_size: 50368, attn_config: {attn_impl: flash}}
    -> model: {d_model: 768, n_heads: 12, n_layers: 12, expansion_ratio: 4, max_seq_len: 2048,
               vocab_size: 50368, attn: learned, no_bias: false, ...}

Foundry's defaults are MPTConfig's, not Tessera's: learned position embeddings unless `attn_config.alibi`
or `rope` is on, biases in every layer unless `no_bias`, one dropout each for the embedding, attention
and residual. What has the same maths maps (LayerNorm in low precision, the flash or torch kernel,
either cross-entropy); what Tessera's GPT does not have (mixture-of-experts or GLU FFNs, grouped-query
attention, QK-norm, softcapping, sliding windows...) is refused naming the key.
"""

from __future__ import annotations

from typing import Any

from tessera.llm.foundry.errors import refuse, section, unknown, warn

# MPTConfig's keys, and ComposerMPTCausalLM's own (name, loss_fn, metrics).
_MPT_KEYS = {"name", "d_model", "n_heads", "n_layers", "head_dim", "expansion_ratio", "max_seq_len", "vocab_size",
             "resid_pdrop", "emb_pdrop", "learned_pos_emb", "attn_config", "ffn_config", "init_device",
             "logit_scale", "no_bias", "attention_bias", "embedding_fraction", "norm_type", "norm_eps", "use_cache",
             "init_config", "fc_type", "tie_word_embeddings", "use_pad_tok_in_ffn", "block_overrides",
             "final_logit_softcapping", "loss_fn", "use_train_metrics", "additional_train_metrics", "verbose"}
_ATTN_KEYS = {"attn_type", "attn_pdrop", "attn_impl", "qk_ln", "qk_gn", "fused_qkv", "clip_qkv", "softmax_scale",
              "attn_uses_sequence_id", "sliding_window_size", "attn_logit_softcapping", "alibi", "alibi_bias_max",
              "rope", "nope", "rope_theta", "rope_impl", "rope_dail_config", "rope_hf_config",
              "attn_temperature_tuning", "kv_dim", "kv_n_heads"}
_NORMS = {"layernorm": "layernorm", "low_precision_layernorm": "layernorm", "triton_layernorm": "layernorm",
          "rmsnorm": "rmsnorm", "low_precision_rmsnorm": "rmsnorm", "triton_rmsnorm": "rmsnorm"}
MOE_FFNS = ("mb_moe", "mb_dmoe")


def mpt_model(model: dict[str, Any], max_seq_len: Any) -> dict[str, Any]:
    """The recipe's `model` section (GPTConfig keys) for a Foundry `mpt_causal_lm` section."""
    unknown("model", model, _MPT_KEYS)
    out: dict[str, Any] = {key: model[key] for key in ("d_model", "n_heads", "n_layers", "vocab_size")
                           if model.get(key) is not None}
    out["max_seq_len"] = model.get("max_seq_len", max_seq_len if max_seq_len is not None else 2048)
    ratio = model.get("expansion_ratio", 4)
    if not isinstance(ratio, (int, float)) or ratio != int(ratio):
        raise refuse("model.expansion_ratio", "Tessera's MLP is a whole multiple of d_model wide", ratio)
    out["expansion_ratio"] = int(ratio)
    head_dim = model.get("head_dim")
    if head_dim is not None and head_dim * model.get("n_heads", 16) != model.get("d_model", 2048):
        raise refuse("model.head_dim", "Tessera's heads are d_model / n_heads wide", head_dim)
    out["no_bias"] = bool(model.get("no_bias", False))
    if model.get("attention_bias") is not None and model["attention_bias"] == out["no_bias"]:
        raise refuse("model.attention_bias", "Tessera's attention has biases exactly when its other layers do "
                                             "(model.no_bias)", model["attention_bias"])
    out["tie_embeddings"] = bool(model.get("tie_word_embeddings", True))
    norm = model.get("norm_type", "low_precision_layernorm")
    if norm not in _NORMS:
        raise refuse("model.norm_type", f"not one of Tessera's norms ({', '.join(_NORMS)})", norm)
    out["norm"], out["norm_eps"] = _NORMS[norm], model.get("norm_eps", 1e-5)
    attn = section(model.get("attn_config"), "model.attn_config")
    out.update(_positions(model, attn))
    out["dropout"] = _dropout(model, attn)
    _refuse_unsupported(model, attn)
    _ffn(section(model.get("ffn_config"), "model.ffn_config"), out["expansion_ratio"] * model.get("d_model", 2048))
    _init(section(model.get("init_config"), "model.init_config"), out)
    return out


def _positions(model: dict[str, Any], attn: dict[str, Any]) -> dict[str, Any]:
    """ALiBi, RoPE, or (Foundry's default) a learned table of positions."""
    if attn.get("nope"):
        raise refuse("model.attn_config.nope", "Tessera's GPT always encodes positions (alibi, rope or learned)")
    if attn.get("alibi"):
        return {"attn": "alibi", "alibi_bias_max": attn.get("alibi_bias_max", 8)}
    if attn.get("rope"):
        dail = section(attn.get("rope_dail_config"), "model.attn_config.rope_dail_config")
        if attn.get("rope_impl", "dail") == "dail" and dail.get("type", "original") != "original":
            raise refuse("model.attn_config.rope_dail_config.type", "only the original rotary embedding "
                                                                     "(rotate-half) is implemented", dail["type"])
        scaling = section(attn.get("rope_hf_config"), "model.attn_config.rope_hf_config")
        if attn.get("rope_impl") == "hf" and scaling.get("type", "no_scaling") != "no_scaling":
            raise refuse("model.attn_config.rope_hf_config.type", "rope scaling is not implemented",
                         scaling["type"])
        return {"attn": "rope", "rope_theta": attn.get("rope_theta", 10000)}
    if model.get("learned_pos_emb", True) is False:
        raise refuse("model.learned_pos_emb", "with neither attn_config.alibi nor rope, the model would have no "
                                              "positions: Tessera's GPT always encodes them")
    return {"attn": "learned"}


def _dropout(model: dict[str, Any], attn: dict[str, Any]) -> float:
    """Tessera's one dropout rate, if Foundry's three agree."""
    rates = {"model.emb_pdrop": model.get("emb_pdrop", 0.0), "model.resid_pdrop": model.get("resid_pdrop", 0.0),
             "model.attn_config.attn_pdrop": attn.get("attn_pdrop", 0.0)}
    if len(set(rates.values())) > 1:
        given = ", ".join(f"{k}={v}" for k, v in rates.items())
        raise refuse("model.emb_pdrop", f"Tessera's GPT has one dropout rate for the embedding, attention and "
                                        f"residual; these differ ({given})")
    return float(rates["model.emb_pdrop"])


def _refuse_unsupported(model: dict[str, Any], attn: dict[str, Any]) -> None:
    unknown("model.attn_config", attn, _ATTN_KEYS)
    attn_type = attn.get("attn_type", "multihead_attention")
    if attn_type != "multihead_attention":
        raise refuse("model.attn_config.attn_type", "only multihead_attention is implemented (no grouped-query "
                                                    "or multi-query attention in Tessera's GPT)", attn_type)
    for key, default in (("qk_ln", False), ("qk_gn", False), ("clip_qkv", None), ("softmax_scale", None),
                         ("attn_logit_softcapping", None), ("sliding_window_size", -1), ("kv_dim", None)):
        if attn.get(key, default) not in (default, None):
            raise refuse(f"model.attn_config.{key}", "not implemented in Tessera's GPT", attn[key])
    impl = attn.get("attn_impl", "flash")
    if impl not in ("torch", "flash", "triton"):
        raise refuse("model.attn_config.attn_impl", "not one of LLM Foundry's (torch, flash)", impl)
    if impl != "torch":
        warn(f"model.attn_config.attn_impl={impl}: Tessera computes attention with torch's "
             "scaled_dot_product_attention (the same maths; a flash kernel where the GPU has one, none on a CPU)")
    for key, default in (("logit_scale", None), ("final_logit_softcapping", None), ("block_overrides", None),
                         ("embedding_fraction", 1.0)):
        if model.get(key, default) != default:
            raise refuse(f"model.{key}", "not implemented in Tessera's GPT", model[key])
    fc = model.get("fc_type", "torch")
    if (fc.get("name") if isinstance(fc, dict) else fc) != "torch":
        raise refuse("model.fc_type", "only torch's Linear layers (TransformerEngine's are not used)", fc)
    loss = model.get("loss_fn", "fused_crossentropy")
    if loss not in ("fused_crossentropy", "torch_crossentropy"):
        raise refuse("model.loss_fn", "not one of fused_crossentropy, torch_crossentropy", loss)


def _ffn(ffn: dict[str, Any], hidden: int) -> None:
    kind = ffn.get("ffn_type", "mptmlp")
    if kind in MOE_FFNS:
        raise refuse("model.ffn_config.ffn_type", "a mixture-of-experts FFN (MegaBlocks) is not implemented in "
                                                  "Tessera's GPT", kind)
    if kind != "mptmlp":
        raise refuse("model.ffn_config.ffn_type", "only mptmlp (a GELU MLP) is implemented in Tessera's GPT", kind)
    act = ffn.get("ffn_act_fn")
    if act is not None and (not isinstance(act, dict) or act.get("name") != "gelu"
                            or act.get("approximate", "none") != "none"):
        raise refuse("model.ffn_config.ffn_act_fn", "only the exact GELU of MPT's MLP is implemented")
    unknown("model.ffn_config", ffn, {"ffn_type", "ffn_act_fn", "ffn_hidden_size"})
    if ffn.get("ffn_hidden_size") not in (None, hidden):
        raise refuse("model.ffn_config.ffn_hidden_size", f"Tessera's MLP is expansion_ratio x d_model = {hidden} "
                                                         "wide", ffn["ffn_hidden_size"])


def _init(init: dict[str, Any], out: dict[str, Any]) -> None:
    """Foundry's baseline_ init is Tessera's (normal with init_std, residual projections divided by
    sqrt(2 n_layers)); its default kaiming_normal_ is not implemented: a warning, since the model's maths
    is unchanged, only where its random weights start."""
    name = init.get("name", "kaiming_normal_")
    if name == "baseline_" and init.get("init_div_is_residual", True) is True:
        out["init_std"] = init.get("init_std", 0.02)
        return
    warn(f"model.init_config.name={name}: initialization not implemented; the weights start as LLM Foundry's "
         "baseline_ with init_std 0.02 (normal, residual projections scaled by 1/sqrt(2 n_layers))")
