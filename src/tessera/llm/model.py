"""An MPT-style decoder-only transformer, in one file.

    cfg = GPTConfig.named("tiny", vocab_size=tokenizer.vocab_size)
    model = GPT(cfg)
    loss = model({"tokens": tokens})                  # tokens: integer tensor [B, L] -> next-token loss
    logits = model(input_ids)                         # [B, T] -> [B, T, vocab]
    loss = model(input_ids, targets=targets)          # targets[b, t] is the token after input_ids[b, t]

The trainer contract is `model(batch) -> loss` with `batch = {"tokens": [B, L]}`: positions 0..L-2 predict
tokens 1..L-1 (so a window of L tokens gives L-1 predictions, as in LLM Foundry). `-100` in targets (or in
an optional `batch["labels"]`, aligned with `tokens`) is ignored. Packed fine-tuning rows add
`batch["position_ids"]` and/or `batch["sequence_ids"]` ([B, L], `tessera.llm.finetune.batch`): attention
stays inside each example (a block-diagonal causal mask), RoPE counts positions from each example's start.

Shape of the network (MPT): token embedding, no position embedding (ALiBi biases attention by distance;
RoPE rotates queries and keys instead; `attn="learned"` adds MPT's learned position table, `wpe`), `n_layers` pre-norm blocks of fused-QKV attention and a GELU MLP,
a final norm, and an output layer tied to the embedding. Attention runs in `F.scaled_dot_product_attention`:
with RoPE its causal flash kernel; ALiBi's distance bias goes in as an additive mask (the memory-efficient
kernel on GPUs). Parameter names follow MPT's.

Large configs build on the meta device in milliseconds, for parameter and FLOP counts:
`with torch.device("meta"): GPT(GPTConfig.named("mpt-7b")).num_params()`; to train one, materialize with
`model.to_empty(device=...)` (after sharding) and call `model.init_weights()`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tessera.suggest import did_you_mean, hint

IGNORE_INDEX = -100
Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) of the positions in a forward pass

# MPT's published shapes (LLM Foundry's pretrain YAMLs), and a model small enough to train on a CPU.
NAMED_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=256, n_heads=4, n_layers=4, max_seq_len=256, vocab_size=8192),
    "mpt-125m": dict(d_model=768, n_heads=12, n_layers=12, max_seq_len=2048, vocab_size=50368),
    "mpt-350m": dict(d_model=1024, n_heads=16, n_layers=24, max_seq_len=2048, vocab_size=50368),
    "mpt-1b": dict(d_model=2048, n_heads=16, n_layers=24, max_seq_len=2048, vocab_size=50368),
    "mpt-3b": dict(d_model=2560, n_heads=20, n_layers=32, max_seq_len=2048, vocab_size=50368),
    "mpt-7b": dict(d_model=4096, n_heads=32, n_layers=32, max_seq_len=2048, vocab_size=50368),
}


def _key(default: Any, meaning: str) -> Any:
    """A GPTConfig field with its one line of meaning (`help` in the field's metadata)."""
    return field(default=default, metadata={"help": meaning})


@dataclass
class GPTConfig:
    # Each field's `help` is its line in `tessera train --list-keys` (recipe_keys.recipe_keys).
    d_model: int = _key(256, "Width of the residual stream (embedding size).")
    n_heads: int = _key(4, "Attention heads; must divide d_model.")
    n_layers: int = _key(4, "Transformer blocks.")
    vocab_size: int = _key(50368, "Token embedding rows (at least the tokenizer's vocabulary).")
    max_seq_len: int = _key(2048, "Longest sequence the model takes.")
    expansion_ratio: int = _key(4, "MLP hidden size = expansion_ratio * d_model.")
    attn: str = _key("alibi", "Positions: alibi | rope | learned (MPT's learned_pos_emb: a table).")
    alibi_bias_max: float = _key(8.0, "ALiBi slopes 2^(-alibi_bias_max * h / n_heads), as in MPT.")
    rope_theta: float = _key(10000.0, "RoPE base frequency.")
    no_bias: bool = _key(True, "No biases in linear layers and norms (MPT's default).")
    norm: str = _key("layernorm", "layernorm | rmsnorm.")
    norm_eps: float = _key(1e-5, "Epsilon of the norms.")
    tie_embeddings: bool = _key(True, "The output layer reuses the token embedding.")
    dropout: float = _key(0.0, "Embedding, attention and residual dropout.")
    init_std: float = _key(0.02, "Standard deviation of the initial weights.")

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "vocab_size", "max_seq_len", "expansion_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        if self.attn not in ("alibi", "rope", "learned"):
            raise ValueError(f"model.attn must be 'alibi', 'rope' or 'learned', got {self.attn!r}")
        if self.attn == "rope" and self.head_dim % 2:
            raise ValueError(f"model.attn='rope' needs an even head size, got d_model/n_heads = {self.head_dim}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"model.norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        """A config from a dict; `name` (optional) picks a named config the other keys override."""
        values = dict(values)
        base = NAMED_CONFIGS[_check_name(values.pop("name"))] if values.get("name") else {}
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                raise ValueError(f"unknown model config key {key!r}{hint(key, known, list_known=True)}")
        return cls(**{**base, **values})

    @classmethod
    def named(cls, name: str, **overrides: Any) -> GPTConfig:
        return cls.from_dict({"name": name, **overrides})


def _check_name(name: str) -> str:
    if name not in NAMED_CONFIGS:
        meant = did_you_mean(name, NAMED_CONFIGS)
        raise ValueError(f"unknown model config {name!r}; {meant + ' ' if meant else ''}"
                         f"choose from {', '.join(NAMED_CONFIGS)}")
    return name


class KVCache:
    """Keys and values of the tokens seen so far, preallocated for `max_len` positions per layer."""

    def __init__(self, cfg: GPTConfig, batch_size: int, max_len: int, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        shape = (cfg.n_layers, batch_size, cfg.n_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.pos = 0  # tokens already stored; advanced by GPT.forward after every layer has written

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.pos + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {end} positions needed, {self.max_len} allocated")
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def alibi_slopes(n_heads: int, bias_max: float = 8.0) -> torch.Tensor:
    """MPT's ALiBi slopes; for a head count that is not a power of two, interleaved from the next one."""
    n = 2 ** math.ceil(math.log2(n_heads))
    slopes = 1.0 / 2 ** (torch.arange(1, n + 1, dtype=torch.float32) * (bias_max / n))
    if n != n_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (rotate-half form) of x: [B, H, T, D] with cos, sin: [T, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def make_norm(cfg: GPTConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=not cfg.no_bias)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.Wqkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=not cfg.no_bias)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=not cfg.no_bias)
        self.out_proj.residual = True  # type: ignore[assignment]  # scaled init, see GPT._init_weights

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, rope: Rope | None, layer: int,
                cache: KVCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads: under tensor parallelism this rank computes only its share of the heads
        q, k, v = (t.view(B, T, -1, self.cfg.head_dim).transpose(1, 2) for t in self.Wqkv(x).chunk(3, dim=-1))
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        # Without a mask (training, RoPE) the kernel's own causal mask applies; a mask carries ALiBi or
        # the offset causal pattern of a cached step.
        causal = attn_mask is None and T > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal,
                                           dropout_p=self.cfg.dropout if self.training else 0.0)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        hidden = cfg.expansion_ratio * cfg.d_model
        self.up_proj = nn.Linear(cfg.d_model, hidden, bias=not cfg.no_bias)
        self.down_proj = nn.Linear(hidden, cfg.d_model, bias=not cfg.no_bias)
        self.down_proj.residual = True  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.norm_1, self.attn = make_norm(cfg), Attention(cfg)
        self.norm_2, self.ffn = make_norm(cfg), MLP(cfg)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, rope: Rope | None, layer: int,
                cache: KVCache | None) -> torch.Tensor:
        x = x + self.resid_dropout(self.attn(self.norm_1(x), attn_mask, rope, layer, cache))
        return x + self.resid_dropout(self.ffn(self.norm_2(x)))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.d_model),
            emb_drop=nn.Dropout(cfg.dropout),
            blocks=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers)),
            norm_f=make_norm(cfg),
        ))
        if cfg.attn == "learned":
            self.transformer["wpe"] = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for name in {"alibi": ("alibi_slopes",), "rope": ("rope_cos", "rope_sin")}.get(cfg.attn, ()):
            self.register_buffer(name, None, persistent=False)
        self.init_weights()

    def init_weights(self) -> None:
        """(Re)initialize parameters and position buffers, e.g. after `to_empty()` of a meta-device model."""
        cfg, device = self.cfg, self.transformer.wte.weight.device
        if cfg.attn == "alibi":
            self.alibi_slopes = alibi_slopes(cfg.n_heads, cfg.alibi_bias_max).to(device)
        elif cfg.attn == "rope":
            half = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32, device=device) / cfg.head_dim
            positions = torch.arange(cfg.max_seq_len, dtype=torch.float32, device=device)
            angles = torch.outer(positions, 1.0 / cfg.rope_theta ** half).repeat(1, 2)
            self.rope_cos, self.rope_sin = angles.cos(), angles.sin()
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """Normal(0, init_std) weights; residual output projections scaled by 1/sqrt(2 n_layers) (GPT-2)."""
        if isinstance(module, nn.Linear):
            std = self.cfg.init_std
            if getattr(module, "residual", False):
                std /= math.sqrt(2 * self.cfg.n_layers)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)
        elif isinstance(module, nn.LayerNorm | nn.RMSNorm):
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def tp_plan(self) -> dict[str, str]:
        """How tensor parallelism splits this model (module-name pattern -> style; the train layer applies
        it, train/parallel/tensor_parallel.py): Megatron's layout with sequence parallelism. The fused QKV
        and the MLP's first layer split their outputs (heads, hidden units), the output projections their
        inputs; norms and the residual stream run on a slice of the sequence between them. Embeddings and
        the tied output layer stay whole. Needs n_heads divisible by the degree."""
        last = self.cfg.n_layers - 1
        ends = {"transformer.blocks.0": "sequence_input", f"transformer.blocks.{last}": "sequence_output"}
        if last == 0:
            ends = {"transformer.blocks.0": "sequence_input+sequence_output"}
        per_block = {"norm_1": "sequence_parallel", "attn": "attention_input", "attn.Wqkv": "colwise_fused_qkv",
                     "attn.out_proj": "rowwise_to_sequence", "norm_2": "sequence_parallel", "ffn": "mlp_input",
                     "ffn.up_proj": "colwise", "ffn.down_proj": "rowwise_to_sequence"}
        return {**ends, **{f"transformer.blocks.*.{name}": style for name, style in per_block.items()}}

    # --- accounting (MFU) -------------------------------------------------------------------------

    def num_params(self) -> int:
        """Every trainable parameter, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token at `seq_len` (default: the model's window): `training_flops_per_token`."""
        return training_flops_per_token(self.num_params(), self.cfg.n_layers, self.cfg.d_model,
                                        seq_len or self.cfg.max_seq_len)

    # --- forward ------------------------------------------------------------------------------------

    def new_kv_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        weight = self.transformer.wte.weight
        return KVCache(self.cfg, batch_size, max_len or self.cfg.max_seq_len, weight.device, weight.dtype)

    def _attention_inputs(self, T: int, start: int, device: torch.device, dtype: torch.dtype,
                          position_ids: torch.Tensor | None = None,
                          sequence_ids: torch.Tensor | None = None) -> tuple[torch.Tensor | None, Rope | None]:
        """(attention mask, RoPE tables) for queries at positions start..start+T-1 over keys 0..start+T-1.

        Packed rows (`sequence_ids` [B, T], one id per example) attend only inside their example: the
        causal mask becomes block-diagonal, and RoPE takes each token's position in its example."""
        q_pos = torch.arange(start, start + T, device=device)[:, None]
        k_pos = torch.arange(start + T, device=device)[None, :]
        allowed = None
        if sequence_ids is not None:
            allowed = ((sequence_ids[:, :, None] == sequence_ids[:, None, :]) & (k_pos <= q_pos))[:, None]
        if self.cfg.attn == "alibi":
            slopes = self.alibi_slopes.to(dtype)[:, None, None]  # [H, 1, 1]
            bias = -slopes * (q_pos - k_pos).clamp(min=0).to(dtype)
            # inside one example the distance in the row is the distance in the example
            return bias.masked_fill(~allowed if allowed is not None else k_pos > q_pos, float("-inf")), None
        rope = None  # learned positions went in with the embedding
        if self.cfg.attn == "rope" and position_ids is not None:
            rope = (self.rope_cos[position_ids][:, None].to(dtype), self.rope_sin[position_ids][:, None].to(dtype))
        elif self.cfg.attn == "rope":
            rope = (self.rope_cos[start:start + T].to(dtype), self.rope_sin[start:start + T].to(dtype))
        if allowed is not None:
            return allowed, rope
        return (None if start == 0 else k_pos <= q_pos), rope

    def forward(self, input_ids: torch.Tensor | dict[str, torch.Tensor], targets: torch.Tensor | None = None,
                kv_cache: KVCache | None = None, position_ids: torch.Tensor | None = None,
                sequence_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab]; or the mean cross-entropy when `targets` or a batch dict is given.

        `position_ids`/`sequence_ids` [B, T] describe packed rows (`_attention_inputs`); either gives the
        other (positions restart where the sequence changes)."""
        if isinstance(input_ids, dict):
            return self.loss(input_ids)
        B, T = input_ids.shape
        start = kv_cache.pos if kv_cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {start + T} tokens is longer than "
                             f"model.max_seq_len={self.cfg.max_seq_len}")
        if (position_ids is not None or sequence_ids is not None) and kv_cache is not None:
            raise ValueError("packed rows (position_ids, sequence_ids) are for training, not a KV-cached step")
        position_ids, sequence_ids = packed_positions(position_ids, sequence_ids)
        x = self.transformer.wte(input_ids)
        if self.cfg.attn == "learned":  # MPT adds the position table before the embedding dropout
            positions = position_ids if position_ids is not None else torch.arange(start, start + T, device=x.device)
            x = x + self.transformer.wpe(positions)
        x = self.transformer.emb_drop(x)
        attn_mask, rope = self._attention_inputs(T, start, x.device, x.dtype, position_ids, sequence_ids)
        for layer, block in enumerate(self.transformer.blocks):
            x = block(x, attn_mask, rope, layer, kv_cache)
        if kv_cache is not None:
            kv_cache.pos += T
        x = self.transformer.norm_f(x)
        logits = F.linear(x, self.transformer.wte.weight) if self.lm_head is None else self.lm_head(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1).long(),
                               ignore_index=IGNORE_INDEX)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Next-token cross-entropy of {"tokens": [B, L]} (and optional "labels" aligned with tokens, and
        "position_ids"/"sequence_ids" of packed rows: no prediction crosses from one example to the next)."""
        tokens = batch["tokens"].long()
        labels = batch.get("labels")
        targets = (tokens if labels is None else labels.long())[:, 1:]
        position_ids, sequence_ids = packed_positions(batch.get("position_ids"), batch.get("sequence_ids"))
        if sequence_ids is None:
            return self(tokens[:, :-1], targets=targets)
        targets = targets.masked_fill(sequence_ids[:, 1:] != sequence_ids[:, :-1], IGNORE_INDEX)
        return self(tokens[:, :-1], targets=targets, position_ids=position_ids[:, :-1],
                    sequence_ids=sequence_ids[:, :-1])


def training_flops_per_token(params: int, n_layers: int, d_model: int, seq_len: int, frozen: int = 0) -> int:
    """Training FLOPs per token (forward + backward) of a decoder: 6N + 12 * n_layers * d_model * seq_len.

    The standard estimate (Kaplan et al.; PaLM appendix B; LLM Foundry's MFU): 2N per token for the
    matmuls forward and 4N backward, plus the attention scores and their weighted sum, which grow with
    the context length. `frozen` of the N (a LoRA base) need no weight gradients: 4 per token, not 6.
    Shared by Tessera's GPT and the plan of any recipe (llm/plan.py).
    """
    return 6 * params - 2 * frozen + 12 * n_layers * d_model * seq_len


def packed_positions(position_ids: torch.Tensor | None,
                     sequence_ids: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(position_ids, sequence_ids) of packed rows, each derived from the other when only one is given:
    a sequence starts where the position is 0; a position counts from where the sequence id changed."""
    if position_ids is None and sequence_ids is None:
        return None, None
    if sequence_ids is None:
        assert position_ids is not None
        sequence_ids = (position_ids == 0).long().cumsum(-1)
    if position_ids is None:
        index = torch.arange(sequence_ids.size(-1), device=sequence_ids.device).expand_as(sequence_ids)
        starts = torch.ones_like(sequence_ids, dtype=torch.bool)
        starts[:, 1:] = sequence_ids[:, 1:] != sequence_ids[:, :-1]
        position_ids = index - torch.where(starts, index, 0).cummax(-1).values
    return position_ids.long(), sequence_ids
