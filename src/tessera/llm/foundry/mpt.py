"""LLM Foundry's `mpt_causal_lm` as Tessera's GPT (llm/model.py), which follows MPT's layout and names.

    model: {name: mpt_causal_lm, d_model: 768, n_heads: 12, n_layers: 12, expansion_ratio: 4,
            max_seq_len: 2048, vocab_size: 50368, attn_config: {attn_impl: flash}}
    -> model: {d_model: 768, n_heads: 12, n_layers: 12, expansion_ratio: 4, max_seq_len: 2048,
               vocab_size: 50368, attn: learned, no_bias: false, ...}

The model section has MPTConfig's keys, the ones an MPT's config.json holds, so which MPT features map
and which are refused (with MPTConfig's defaults: learned positions, biases, one dropout...) is
llm/hf/mpt.py's `gpt_values_from_mpt`, the one owner, whose refusals are named here under `model.`. What
is the YAML's alone stays here: its keys checked by name (Foundry refuses unknown ones too), `name`,
`init_device`, `loss_fn`, the attention kernel (`attn_impl`: a warning, the same maths) and the
initialization (`init_config`: baseline_ maps, other schemes a warning), and `max_seq_len` taken from
the YAML's top level when the section leaves it out.
"""

from __future__ import annotations

from typing import Any

from tessera.llm.foundry.errors import FoundryError, refuse, section, unknown, warn
from tessera.llm.hf.mpt import MptKeyRefused, gpt_values_from_mpt

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


def mpt_model(model: dict[str, Any], max_seq_len: Any) -> dict[str, Any]:
    """The recipe's `model` section (GPTConfig keys) for a Foundry `mpt_causal_lm` section."""
    unknown("model", model, _MPT_KEYS)
    attn = section(model.get("attn_config"), "model.attn_config")
    unknown("model.attn_config", attn, _ATTN_KEYS)
    seq_len = model.get("max_seq_len", max_seq_len if max_seq_len is not None else 2048)
    try:
        out = gpt_values_from_mpt({**model, "max_seq_len": seq_len})
    except MptKeyRefused as exc:
        raise FoundryError(f"model.{exc}") from None
    _foundry_only(model, attn)
    _init(section(model.get("init_config"), "model.init_config"), out)
    return out


def _foundry_only(model: dict[str, Any], attn: dict[str, Any]) -> None:
    """The attention kernel and the loss: how Composer computes the same maths."""
    impl = attn.get("attn_impl", "flash")
    if impl not in ("torch", "flash", "triton"):
        raise refuse("model.attn_config.attn_impl", "not one of LLM Foundry's (torch, flash)", impl)
    if impl != "torch":
        warn(f"model.attn_config.attn_impl={impl}: Tessera computes attention with torch's "
             "scaled_dot_product_attention (the same maths; a flash kernel where the GPU has one, none on a CPU)")
    loss = model.get("loss_fn", "fused_crossentropy")
    if loss not in ("fused_crossentropy", "torch_crossentropy"):
        raise refuse("model.loss_fn", "not one of fused_crossentropy, torch_crossentropy", loss)


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
