"""MPT (LLM Foundry's and transformers') as Tessera's GPT: the config mapped, the weights renamed.

    cfg = gpt_config_from_mpt(config_json, "ckpt.pt")       # GPTConfig, or MptUnsupported naming the feature
    state = gpt_state_from_mpt(weights, cfg, "ckpt.pt")      # Foundry / transformers names -> the GPT's

This module is the one owner of which MPT features Tessera's GPT computes and which it refuses: a
config.json, a Composer checkpoint's config and the `model:` section of an LLM Foundry YAML (which
llm/foundry/mpt.py reads) use the same keys, so all three go through `gpt_values_from_mpt`.

The GPT follows MPT's layout and parameter names (fused Wqkv, GELU MLP, pre-norm blocks, tied output
layer), so most weights keep their names; what differs is mapped exactly or refused with one line:

- mapped: ALiBi (slopes from `alibi_bias_max`), RoPE (`rope_impl` hf or dail, no scaling), learned
  positions (`learned_pos_emb` without ALiBi/RoPE: the GPT's `attn="learned"`), `no_bias`, untied
  embeddings (`lm_head`), LayerNorm / RMSNorm (the low-precision and triton variants compute the same),
  separate Wq/Wk/Wv (`fused_qkv: false`: concatenated), `norm_attn_norm` (fused block modules), grouped
  or multi-query attention with as many KV heads as heads, an FFN hidden size (`expansion_ratio` or
  `ffn_config.ffn_hidden_size`) that is a whole multiple of d_model, equal dropouts.
- refused: `qk_ln`/`qk_gn` and `clip_qkv` (the GPT does not normalise or clamp queries and keys), a
  `softmax_scale` other than 1/sqrt(head_dim), fewer KV heads than heads, sliding windows, soft-capping,
  temperature tuning, cross-attention (`kv_dim`), `nope`, `logit_scale`, `embedding_fraction` < 1 (it
  scales the embedding's gradient), GLU and mixture-of-experts FFNs, other activations, `block_overrides`,
  TransformerEngine layers, position tables and scalings the GPT does not have, no positions at all.

Which config keys exist, and their defaults when a config leaves them out, are LLM Foundry's MPTConfig
(llmfoundry/models/mpt/configuration_mpt.py and utils/config_defaults.py), not GPTConfig's: 2048 wide,
16 heads, 24 layers, learned positions, biases, no dropout. A transformers `MptConfig` saves
`layer_norm_epsilon` where Foundry writes `norm_eps`; both are read. transformers' own MptForCausalLM
always uses ALiBi with slopes for alibi_bias_max 8, no biases and a 4x MLP whatever the config says; the
config is what the weights were trained with, so it is the config that is followed here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from tessera.llm.model import GPT, GPTConfig

# Wrappers that older Composer and torch versions left in parameter names (DDP, FSDP1, activation
# checkpointing, torch.compile); Composer's HuggingFaceModel holds the MPT as `.model`.
_WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "module.")
# Foundry's norm registry (llmfoundry/models/layers/norm.py): the low-precision and triton variants compute
# the same (in the autocast precision), so they are the GPT's two norms.
_NORMS = {"layernorm": "layernorm", "low_precision_layernorm": "layernorm", "rmsnorm": "rmsnorm",
          "low_precision_rmsnorm": "rmsnorm", "triton_rmsnorm": "rmsnorm"}
MOE_FFNS = ("mb_moe", "mb_dmoe")  # Foundry's ffns_with_megablocks
# What MPTMLP takes (Foundry passes ffn_config to it as keyword arguments; it writes fc_type there itself).
_FFN_KEYS = {"ffn_type", "ffn_act_fn", "ffn_hidden_size", "fc_type"}
# (key, the value that leaves the GPT's maths unchanged, what a different value would do)
_ATTN_OFF = (("qk_ln", False, "normalised queries and keys"), ("qk_gn", False, "normalised queries and keys"),
             ("clip_qkv", None, "clamped queries, keys and values"),
             ("sliding_window_size", -1, "windowed attention"), ("attn_logit_softcapping", None, "soft-capping"),
             ("kv_dim", None, "cross-attention"), ("prefix_lm", False, "bidirectional prefixes"),
             ("nope", False, "no positions (LLM Foundry refuses it outside block_overrides too)"))
_MODEL_OFF = (("logit_scale", None, "scaled logits"), ("final_logit_softcapping", None, "soft-capped logits"),
              ("embedding_fraction", 1.0, "a scaled embedding gradient"),
              ("block_overrides", None, "layers that differ from one another"))


class MptUnsupported(ValueError):
    """An MPT config or checkpoint that Tessera's GPT cannot reproduce exactly; one line names the feature."""


class MptKeyRefused(MptUnsupported):
    """One key of an MPT config (dotted below the config: `attn_config.qk_ln`) that the GPT cannot honour;
    the message is `key=value: why`, which each reader prefixes: the checkpoint's name, or `model.` of a
    Foundry YAML."""

    def __init__(self, key: str, why: str, value: Any = None) -> None:
        shown = f"={value}" if value is not None and not isinstance(value, (dict, list)) else ""
        super().__init__(f"{key}{shown}: {why}")


def gpt_config_from_mpt(config: Mapping[str, Any], where: str) -> GPTConfig:
    """The GPTConfig computing what the MPT `config` (a config.json's dict) computes; `where` names the
    source in the error."""
    if config.get("model_type", "mpt") != "mpt":
        raise MptUnsupported(f"{where}: model_type {config.get('model_type')!r} is not MPT; only MPT models "
                             "load into Tessera's GPT (use the model as a transformers model instead)")
    try:
        return GPTConfig(**gpt_values_from_mpt(config))
    except MptKeyRefused as exc:
        raise MptUnsupported(f"{where}: {exc}; this MPT model cannot load into Tessera's GPT") from None
    except ValueError as exc:
        raise MptUnsupported(f"{where}: {exc}") from None


def gpt_values_from_mpt(config: Mapping[str, Any]) -> dict[str, Any]:
    """GPTConfig's values (a dict) computing what the MPT `config` computes: a config.json's dict or a Foundry
    YAML's model section. Absent keys take MPTConfig's defaults; MptKeyRefused names the first key the GPT
    does not compute the same way."""
    attn, ffn = _mapping(config, "attn_config"), _mapping(config, "ffn_config")
    d_model, n_heads = _whole(config, "d_model", 2048), _whole(config, "n_heads", 16)
    if d_model % n_heads:
        raise MptKeyRefused("n_heads", f"does not divide d_model={d_model}", n_heads)
    if config.get("head_dim") not in (None, d_model // n_heads):
        raise MptKeyRefused("head_dim", f"Tessera's heads are d_model / n_heads = {d_model // n_heads} wide",
                            config["head_dim"])
    _refuse_attention(attn, n_heads, d_model // n_heads)
    _refuse_model(config)
    values: dict[str, Any] = {
        "d_model": d_model, "n_heads": n_heads, "n_layers": _whole(config, "n_layers", 24),
        "vocab_size": _whole(config, "vocab_size", 50368), "max_seq_len": _whole(config, "max_seq_len", 2048),
        "expansion_ratio": _ffn(config, ffn, d_model), "no_bias": _no_bias(config),
        "tie_embeddings": _flag(config, "tie_word_embeddings", True), "dropout": _dropout(config, attn)}
    norm = config.get("norm_type", "low_precision_layernorm")
    if norm not in _NORMS:
        raise MptKeyRefused("norm_type", f"not one of LLM Foundry's norms ({', '.join(_NORMS)})", norm)
    eps = _number(config, "norm_eps", config.get("layer_norm_epsilon", 1e-5))
    values.update(norm=_NORMS[norm], norm_eps=eps, **_positions(config, attn))
    return values


# The readers below take `under`: the key's section, as the error names it ("attn_config.").

def _mapping(config: Mapping[str, Any], key: str, under: str = "") -> dict[str, Any]:
    """A sub-config (attn_config, ffn_config...): absent or null is MPTConfig's defaults."""
    value = config.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise MptKeyRefused(f"{under}{key}", f"must be a mapping, got {type(value).__name__}")
    return dict(value or {})


def _whole(config: Mapping[str, Any], key: str, default: int, under: str = "") -> int:
    value = config.get(key, default)
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value != int(value) or value < 1):
        raise MptKeyRefused(f"{under}{key}", "must be a positive whole number", value)
    return int(value)


def _number(config: Mapping[str, Any], key: str, default: float, under: str = "") -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MptKeyRefused(f"{under}{key}", "must be a number", value)
    return float(value)


def _flag(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise MptKeyRefused(key, "must be true or false", value)
    return value


def _no_bias(config: Mapping[str, Any]) -> bool:
    """MPT's `attention_bias` (None: `not no_bias`) may differ from the other layers'; the GPT's may not."""
    no_bias = _flag(config, "no_bias", False)
    if config.get("attention_bias") not in (None, not no_bias):
        raise MptKeyRefused("attention_bias", f"Tessera's attention has biases exactly when its other layers "
                                              f"do (no_bias={no_bias})", config["attention_bias"])
    return no_bias


def _dropout(config: Mapping[str, Any], attn: dict[str, Any]) -> float:
    """The GPT's one dropout rate, if MPT's three (embedding, attention weights, residual) agree."""
    rates = {"emb_pdrop": _number(config, "emb_pdrop", 0.0), "resid_pdrop": _number(config, "resid_pdrop", 0.0),
             "attn_config.attn_pdrop": _number(attn, "attn_pdrop", 0.0, "attn_config.")}
    if len(set(rates.values())) > 1:
        given = ", ".join(f"{k}={v}" for k, v in rates.items())
        raise MptKeyRefused("emb_pdrop", f"Tessera's GPT has one dropout rate for the embedding, attention and "
                                         f"residual; these differ ({given})")
    return rates["emb_pdrop"]


def _positions(config: Mapping[str, Any], attn: dict[str, Any]) -> dict[str, Any]:
    """ALiBi, RoPE, or (MPT's default) a learned table of positions; MPT ignores learned_pos_emb with either."""
    if attn.get("alibi") and attn.get("rope"):
        raise MptKeyRefused("attn_config.rope", "with attn_config.alibi too: MPT applies both, Tessera's GPT one")
    if attn.get("alibi"):
        return {"attn": "alibi", "alibi_bias_max": _number(attn, "alibi_bias_max", 8, "attn_config.")}
    if attn.get("rope"):
        impl = attn.get("rope_impl", "dail")
        dail = (_mapping(attn, "rope_dail_config", "attn_config.").get("type") or "original") if impl == "dail" else "original"
        scaling = (_mapping(attn, "rope_hf_config", "attn_config.").get("type") or "no_scaling") if impl == "hf" else "no_scaling"
        if impl not in ("dail", "hf"):
            raise MptKeyRefused("attn_config.rope_impl", "not one of LLM Foundry's (dail, hf)", impl)
        if dail != "original":
            raise MptKeyRefused("attn_config.rope_dail_config.type", "only the original rotary embedding "
                                                                     "(rotate-half; no xPos)", dail)
        if scaling not in ("no_scaling", "default"):
            raise MptKeyRefused("attn_config.rope_hf_config.type", "scaled RoPE is not in Tessera's GPT", scaling)
        return {"attn": "rope", "rope_theta": _number(attn, "rope_theta", 10000, "attn_config.")}
    if not _flag(config, "learned_pos_emb", True):
        raise MptKeyRefused("learned_pos_emb", "with neither attn_config.alibi nor rope, the model has no "
                                               "positions: Tessera's GPT always encodes them", False)
    return {"attn": "learned"}


def _refuse_attention(attn: dict[str, Any], n_heads: int, head_dim: int) -> None:
    """The first attention feature the GPT does not compute the same way (it has MPT's multi-head attention)."""
    for key, off, what in _ATTN_OFF:
        if attn.get(key, off) not in (off, None):
            raise MptKeyRefused(f"attn_config.{key}", f"{what} is not in Tessera's GPT", attn[key])
    if (attn.get("attn_temperature_tuning") or {}).get("attn_scale"):
        raise MptKeyRefused("attn_config.attn_temperature_tuning", "temperature tuning is not in Tessera's GPT")
    scale = attn.get("softmax_scale")
    if scale is not None and not math.isclose(_number(attn, "softmax_scale", 0.0, "attn_config."), head_dim ** -0.5):
        raise MptKeyRefused("attn_config.softmax_scale", f"a scale other than 1/sqrt(head_dim={head_dim}) is not "
                                                         "in Tessera's GPT", scale)
    kind = attn.get("attn_type", "multihead_attention")
    kv_heads = {"multihead_attention": n_heads, "multiquery_attention": 1,
                "grouped_query_attention": attn.get("kv_n_heads")}
    if kind not in kv_heads:
        raise MptKeyRefused("attn_config.attn_type", f"not one of LLM Foundry's ({', '.join(kv_heads)})", kind)
    if kv_heads[kind] is None:
        raise MptKeyRefused("attn_config.attn_type", "without attn_config.kv_n_heads (LLM Foundry needs it too)",
                            kind)
    if kv_heads[kind] != n_heads:
        key = "attn_config.kv_n_heads" if kind == "grouped_query_attention" else "attn_config.attn_type"
        raise MptKeyRefused(key, f"{kv_heads[kind]} key/value heads for {n_heads} heads: grouped-query attention "
                                 "is not in Tessera's GPT", attn[key.removeprefix("attn_config.")])


def _refuse_model(config: Mapping[str, Any]) -> None:
    for key, off, what in _MODEL_OFF:
        if config.get(key, off) not in (off, None):
            raise MptKeyRefused(key, f"{what} is not in Tessera's GPT", config[key])
    fc = config.get("fc_type") or "torch"
    if (fc.get("name") if isinstance(fc, Mapping) else fc) != "torch":
        raise MptKeyRefused("fc_type", "only torch's Linear layers (TransformerEngine's are not in Tessera's GPT)",
                            fc)


def _ffn(config: Mapping[str, Any], ffn: dict[str, Any], d_model: int) -> int:
    """The GPT's expansion_ratio for MPT's GELU MLP: its hidden size (ffn_hidden_size, else d_model x
    expansion_ratio, as Foundry resolves it) over d_model."""
    kind = ffn.get("ffn_type", "mptmlp")
    if kind in MOE_FFNS:
        raise MptKeyRefused("ffn_config.ffn_type", "a mixture-of-experts FFN (MegaBlocks) is not in Tessera's GPT",
                            kind)
    if kind != "mptmlp":
        raise MptKeyRefused("ffn_config.ffn_type", "only mptmlp (MPT's GELU MLP) is in Tessera's GPT", kind)
    act = ffn.get("ffn_act_fn")
    if act is not None and (not isinstance(act, Mapping) or act.get("name") != "gelu"
                            or act.get("approximate", "none") != "none"):
        raise MptKeyRefused("ffn_config.ffn_act_fn", "only the exact GELU of MPT's MLP is in Tessera's GPT")
    for key in ffn:
        if key not in _FFN_KEYS:
            raise MptKeyRefused(f"ffn_config.{key}", f"not a key of MPT's mptmlp ({', '.join(sorted(_FFN_KEYS))})")
    if ffn.get("ffn_hidden_size") is not None:
        key, given = "ffn_config.ffn_hidden_size", _whole(ffn, "ffn_hidden_size", 1, "ffn_config.")
        hidden: float = given
    else:
        key, given = "expansion_ratio", _number(config, "expansion_ratio", 4)
        hidden = d_model * given
    if hidden % d_model:
        raise MptKeyRefused(key, f"an FFN hidden size of {hidden:g} is not a whole multiple of d_model={d_model}; "
                                 "Tessera's MLP is an integer expansion_ratio x d_model wide", f"{given:g}")
    return int(hidden) // d_model


def gpt_names(tensors: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """`tensors` (an MPT's state dict, or one field of its optimizer state, keyed by parameter name) under
    the GPT's names: `prefix` and wrapper parts dropped, fused-block modules flattened, separate Wq/Wk/Wv
    concatenated into Wqkv (0-dim values, such as optimizer step counts, are taken from Wq)."""
    out: dict[str, torch.Tensor] = {}
    split: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name = key.removeprefix(prefix)
        for part in _WRAPPER_PARTS:
            name = name.replace(part, "")
        name = name.replace(".norm_attn_norm.", ".")
        stem, _, kind = name.rpartition(".")
        if stem.endswith((".attn.Wq", ".attn.Wk", ".attn.Wv")):
            split.setdefault(f"{stem[:-3]}.Wqkv.{kind}", {})[stem[-2:]] = value
            continue
        out[name] = value
    for name, parts in split.items():
        missing = [p for p in ("Wq", "Wk", "Wv") if p not in parts]
        if missing:
            raise MptUnsupported(f"{name}: separate query/key/value weights without {', '.join(missing)}")
        q, k, v = parts["Wq"], parts["Wk"], parts["Wv"]
        out[name] = q if q.dim() == 0 else torch.cat([q, k, v])
    return out


def gpt_state_from_mpt(state: Mapping[str, Any], cfg: GPTConfig, where: str, prefix: str = "") -> dict[str, Any]:
    """An MPT state dict (Foundry's or transformers' names, under `prefix`) as the GPT's state dict; the
    keys and shapes are checked against a GPT of `cfg` (built on the meta device: no memory, no time)."""
    renamed = gpt_names(state, prefix)
    if cfg.tie_embeddings:
        renamed.pop("lm_head.weight", None)  # transformers may save the tied copy too
    with torch.device("meta"):
        expected = GPT(cfg).state_dict()
    missing = [k for k in expected if k not in renamed]
    unexpected = [k for k in renamed if k not in expected]
    if missing or unexpected:
        what = f"no {prefix}{missing[0]}" if missing else f"{prefix}{unexpected[0]}, which MPT of this config lacks"
        raise MptUnsupported(f"{where}: the weights do not fit the model config: {what} "
                             f"({len(missing)} missing, {len(unexpected)} unexpected)")
    for key, value in expected.items():
        if tuple(renamed[key].shape) != tuple(value.shape):
            raise MptUnsupported(f"{where}: {prefix}{key} has shape {tuple(renamed[key].shape)}, the config "
                                 f"gives {tuple(value.shape)}")
    return {key: renamed[key] for key in expected}


def gpt_from_mpt(state: Mapping[str, Any], config: Mapping[str, Any], where: str, prefix: str = "") -> GPT:
    """A GPT (eval mode, float32) with the MPT's weights."""
    cfg = gpt_config_from_mpt(config, where)
    model = empty_gpt(cfg)
    model.load_state_dict(gpt_state_from_mpt(state, cfg, where, prefix))
    return model.eval()


def empty_gpt(cfg: GPTConfig) -> GPT:
    """A GPT of `cfg` to load weights into: its random init leaves the caller's RNG where it was."""
    torch_state = torch.random.get_rng_state()
    try:
        return GPT(cfg)
    finally:
        torch.random.set_rng_state(torch_state)
