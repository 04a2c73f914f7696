"""MPT (LLM Foundry's and transformers') as Tessera's GPT: the config mapped, the weights renamed.

    cfg = gpt_config_from_mpt(config_json, "ckpt.pt")       # GPTConfig, or MptUnsupported naming the feature
    state = gpt_state_from_mpt(weights, cfg, "ckpt.pt")      # Foundry / transformers names -> the GPT's

The GPT follows MPT's layout and parameter names (fused Wqkv, GELU MLP, pre-norm blocks, tied output
layer), so most weights keep their names; what differs is mapped exactly or refused with one line:

- mapped: ALiBi (slopes from `alibi_bias_max`), RoPE (`rope_impl` hf or dail, no scaling), learned
  positions (`learned_pos_emb` without ALiBi/RoPE: the GPT's `attn="learned"`), `no_bias`, untied
  embeddings (`lm_head`), LayerNorm / RMSNorm (the low-precision and triton variants compute the same),
  separate Wq/Wk/Wv (`fused_qkv: false`: concatenated), `norm_attn_norm` (fused block modules), grouped
  or multi-query attention with as many KV heads as heads, any `expansion_ratio` that gives a whole
  multiple of d_model, equal dropouts.
- refused: `qk_ln`/`qk_gn` and `clip_qkv` (the GPT does not normalise or clamp queries and keys), a
  `softmax_scale` other than 1/sqrt(head_dim), fewer KV heads than heads, sliding windows, soft-capping,
  `logit_scale`, `embedding_fraction` < 1 (it scales the embedding's gradient), GLU and mixture-of-experts
  FFNs, other activations, `block_overrides`, TransformerEngine layers, position tables and scalings the
  GPT does not have.

Which config keys exist, and their defaults when a config leaves them out, are LLM Foundry's
(llmfoundry/models/mpt/configuration_mpt.py and utils/config_defaults.py). A transformers `MptConfig`
saves `layer_norm_epsilon` where Foundry writes `norm_eps`; both are read. transformers' own MptForCausalLM
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
_NORMS = {"layernorm": "layernorm", "low_precision_layernorm": "layernorm", "rmsnorm": "rmsnorm",
          "low_precision_rmsnorm": "rmsnorm", "triton_rmsnorm": "rmsnorm"}


class MptUnsupported(ValueError):
    """An MPT config or checkpoint that Tessera's GPT cannot reproduce exactly; one line names the feature."""


def gpt_config_from_mpt(config: Mapping[str, Any], where: str) -> GPTConfig:
    """The GPTConfig computing what the MPT `config` (a config.json's dict) computes; `where` names the
    source in the error."""
    if config.get("model_type", "mpt") != "mpt":
        raise MptUnsupported(f"{where}: model_type {config.get('model_type')!r} is not MPT; only MPT models "
                             "load into Tessera's GPT (use the model as a transformers model instead)")
    attn = dict(config.get("attn_config") or {})
    ffn = dict(config.get("ffn_config") or {})
    d_model, n_heads = int(config.get("d_model", 2048)), int(config.get("n_heads", 16))
    head_dim = d_model // n_heads if d_model % n_heads == 0 else None
    _refuse_unsupported(config, attn, ffn, head_dim, where)
    hidden = ffn.get("ffn_hidden_size") or int(d_model * config.get("expansion_ratio", 4))
    if hidden % d_model:
        raise MptUnsupported(f"{where}: an FFN hidden size of {hidden} is not a whole multiple of d_model={d_model}; "
                             "Tessera's GPT has an integer expansion_ratio")
    dropouts = {"resid_pdrop": config.get("resid_pdrop", 0.0), "emb_pdrop": config.get("emb_pdrop", 0.0),
                "attn_config.attn_pdrop": attn.get("attn_pdrop", 0.0)}
    if len({float(v or 0.0) for v in dropouts.values()}) > 1:
        raise MptUnsupported(f"{where}: dropouts differ ({', '.join(f'{k}={v}' for k, v in dropouts.items())}); "
                             "Tessera's GPT has one dropout for all three")
    eps = config.get("norm_eps", config.get("layer_norm_epsilon", 1e-5))
    values: dict[str, Any] = dict(
        d_model=d_model, n_heads=n_heads, n_layers=int(config.get("n_layers", 24)),
        vocab_size=int(config.get("vocab_size", 50368)), max_seq_len=int(config.get("max_seq_len", 2048)),
        expansion_ratio=hidden // d_model, no_bias=bool(config.get("no_bias", False)),
        norm=_NORMS[config.get("norm_type", "low_precision_layernorm")], norm_eps=float(eps),
        tie_embeddings=bool(config.get("tie_word_embeddings", True)), dropout=float(config.get("resid_pdrop") or 0.0))
    if attn.get("alibi", False):
        values.update(attn="alibi", alibi_bias_max=float(attn.get("alibi_bias_max", 8)))
    elif attn.get("rope", False):
        values.update(attn="rope", rope_theta=float(attn.get("rope_theta", 10000)))
    else:
        values.update(attn="learned")
    try:
        return GPTConfig(**values)
    except ValueError as exc:
        raise MptUnsupported(f"{where}: {exc}") from None


def _refuse_unsupported(config: Mapping[str, Any], attn: dict[str, Any], ffn: dict[str, Any],
                        head_dim: int | None, where: str) -> None:
    """One line for the first feature of `config` that the GPT does not compute the same way."""
    n_heads = int(config.get("n_heads", 16))
    kv_heads = attn.get("kv_n_heads") or (1 if attn.get("attn_type") == "multiquery_attention" else n_heads)
    scale = attn.get("softmax_scale")
    act = ffn.get("ffn_act_fn") or {"name": "gelu"}
    rope_hf = (attn.get("rope_hf_config") or {}).get("type", "no_scaling")
    rope_dail = (attn.get("rope_dail_config") or {}).get("type", "original")
    fc = config.get("fc_type") or "torch"
    checks: list[tuple[bool, str]] = [
        (bool(attn.get("qk_ln")) or bool(attn.get("qk_gn")), "attn_config.qk_ln/qk_gn: normalised queries and keys"),
        (attn.get("clip_qkv") is not None, f"attn_config.clip_qkv={attn.get('clip_qkv')}: clamped queries, keys "
                                           "and values"),
        (scale is not None and head_dim is not None and not math.isclose(float(scale), head_dim ** -0.5),
         f"attn_config.softmax_scale={scale}: a scale other than 1/sqrt(head_dim)"),
        (config.get("head_dim") not in (None, head_dim), f"head_dim={config.get('head_dim')}: a head size other "
                                                         "than d_model/n_heads"),
        (int(kv_heads) != n_heads, f"kv_n_heads={kv_heads} of {n_heads} heads: grouped-query attention"),
        (attn.get("sliding_window_size", -1) not in (-1, None), "attn_config.sliding_window_size: windowed attention"),
        (attn.get("attn_logit_softcapping") is not None, "attn_config.attn_logit_softcapping"),
        (bool((attn.get("attn_temperature_tuning") or {}).get("attn_scale")), "attn_config.attn_temperature_tuning"),
        (attn.get("kv_dim") is not None, "attn_config.kv_dim: cross-attention"),
        (bool(attn.get("prefix_lm")), "attn_config.prefix_lm: bidirectional prefixes"),
        (bool(attn.get("alibi")) and bool(attn.get("rope")), "attn_config.alibi and rope together"),
        (bool(attn.get("rope")) and attn.get("rope_impl", "dail") == "hf" and rope_hf not in ("no_scaling", "default"),
         f"attn_config.rope_hf_config.type={rope_hf!r}: scaled RoPE"),
        (bool(attn.get("rope")) and attn.get("rope_impl", "dail") == "dail" and rope_dail != "original",
         f"attn_config.rope_dail_config.type={rope_dail!r}: xPos"),
        (not (attn.get("alibi") or attn.get("rope") or config.get("learned_pos_emb", True)),
         "no position information (neither alibi, rope nor learned_pos_emb)"),
        (ffn.get("ffn_type", "mptmlp") != "mptmlp", f"ffn_config.ffn_type={ffn.get('ffn_type')!r}: only MPT's GELU "
                                                    "MLP (mptmlp)"),
        (act.get("name") != "gelu" or act.get("approximate", "none") != "none",
         f"ffn_config.ffn_act_fn={act}: only exact GELU"),
        ((fc.get("name") if isinstance(fc, dict) else fc) != "torch", f"fc_type={fc}: TransformerEngine layers"),
        (config.get("norm_type", "low_precision_layernorm") not in _NORMS, f"norm_type={config.get('norm_type')!r}"),
        (config.get("attention_bias") not in (None, not config.get("no_bias", False)),
         f"attention_bias={config.get('attention_bias')} with no_bias={config.get('no_bias', False)}"),
        (config.get("logit_scale") is not None, f"logit_scale={config.get('logit_scale')}: scaled logits"),
        (config.get("final_logit_softcapping") is not None, "final_logit_softcapping"),
        (float(config.get("embedding_fraction", 1.0)) != 1.0,
         f"embedding_fraction={config.get('embedding_fraction')}: a scaled embedding gradient"),
        (config.get("block_overrides") is not None, "block_overrides: layers that differ from one another"),
    ]
    for refused, feature in checks:
        if refused:
            raise MptUnsupported(f"{where}: {feature} is not in Tessera's GPT; this MPT model cannot load into it")


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
