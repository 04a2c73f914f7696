"""A transformers causal LM behind the trainer's contract, the same one Tessera's GPT keeps (llm/model.py):

    model = HFCausalLM(AutoModelForCausalLM.from_pretrained(folder, local_files_only=True))
    loss = model({"tokens": tokens})          # [B, L]: positions 0..L-2 predict tokens 1..L-1
    loss = model({"tokens": t, "labels": l})  # labels aligned with tokens; -100 is ignored
    logits = model(input_ids)                 # [B, T] -> [B, T, vocab]

Optional `position_ids`, `sequence_ids` and `attention_mask` are aligned with tokens, as the data side
(llm/finetune/batch.py) writes them; the model sees them for the L-1 input positions. Packed rows (several
examples in one row) must not attend across examples: transformers separates them from the position
resets only under flash-attention 2, so for its other kernels (sdpa, eager) the adapter passes a
block-diagonal causal mask built from `sequence_ids` (or from where `position_ids` restart at 0). The wrapped model is `.hf`, so checkpoint keys are `hf.<its keys>`.
The adapter says what its blocks are (`blocks()`, the classes transformers lists in `_no_split_modules`)
so the train layer can shard them, and never applies parallelism itself.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tessera.train.parallel import fsdp_units

IGNORE_INDEX = -100


class HFCausalLM(nn.Module):
    """`model(batch) -> loss` around a transformers `*ForCausalLM` (or the same model with LoRA layers)."""

    def __init__(self, hf: nn.Module, max_seq_len: int | None = None) -> None:
        super().__init__()
        self.hf = hf
        self.max_seq_len = max_seq_len or default_seq_len(hf.config)

    @property
    def config(self) -> Any:
        """The transformers config of the wrapped model."""
        return self.hf.config

    def forward(self, input_ids: torch.Tensor | dict[str, torch.Tensor], **inputs: Any) -> torch.Tensor:
        """Logits [B, T, vocab]; or the mean next-token cross-entropy of a batch dict."""
        if isinstance(input_ids, dict):
            return self.loss(input_ids)
        return self.hf(input_ids=input_ids, use_cache=False, **inputs).logits

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens = batch["tokens"].long()
        labels = batch.get("labels")
        targets = (tokens if labels is None else labels.long())[:, 1:]
        logits = self(tokens[:, :-1], **self._attention_inputs(batch))
        # Summed and divided by at least 1, so a microbatch whose labels are all masked (a long prompt
        # cut before its answer) adds nothing rather than a NaN.
        total = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                                ignore_index=IGNORE_INDEX, reduction="sum")
        return total / (targets != IGNORE_INDEX).sum().clamp(min=1)

    def _attention_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """position_ids and the attention mask of the L-1 input positions (module docstring)."""
        inputs: dict[str, torch.Tensor] = {}
        positions, sequences = batch.get("position_ids"), batch.get("sequence_ids")
        if positions is not None:
            inputs["position_ids"] = positions[:, :-1].long()
        if batch.get("attention_mask") is not None:
            inputs["attention_mask"] = batch["attention_mask"][:, :-1]
        elif getattr(self.hf.config, "_attn_implementation", None) != "flash_attention_2":
            if sequences is None and positions is not None:
                sequences = (positions == 0).long().cumsum(dim=1)
            if sequences is not None and bool((sequences[:, :-1] != sequences[:, :1]).any()):
                inputs["attention_mask"] = packed_mask(sequences[:, :-1], self.hf.dtype)
        return inputs

    def blocks(self) -> list[nn.Module]:
        """The decoder layers: modules of the classes transformers says must not be split."""
        return fsdp_units(self.hf)

    def tp_plan(self) -> dict[str, str]:
        """How tensor parallelism splits the wrapped model: the colwise/rowwise layers of the plan
        transformers ships in the config (`base_model_tp_plan`, e.g. Llama's q/k/v/gate/up colwise, o/down
        rowwise), under this adapter's prefix. Embeddings, norms and the output layer stay whole."""
        plan = getattr(self.hf.config, "base_model_tp_plan", None) or {}
        prefix = f"hf.{self.hf.base_model_prefix}."
        styles = {name: style for name, style in plan.items() if style in ("colwise", "rowwise")}
        if not styles:
            raise ValueError(f"{type(self.hf).__name__} has no tensor-parallel plan in its config "
                             "(base_model_tp_plan); set parallelism.tensor_parallel.degree=1")
        return {prefix + name: style for name, style in styles.items()}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token, 6N + 12 * layers * hidden * seq_len, as GPT.flops_per_token."""
        config = self.hf.config
        layers = getattr(config, "num_hidden_layers", 0) or 0
        hidden = getattr(config, "hidden_size", 0) or 0
        return 6 * self.num_params() + 12 * layers * hidden * (seq_len or self.max_seq_len)


def packed_mask(sequences: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive 4-D mask [B, 1, T, T] letting each position see the earlier positions of its own
    sequence only (0 where allowed, the dtype's minimum elsewhere: the form every transformers kernel
    takes; a boolean one is read inverted by some)."""
    T = sequences.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=sequences.device).tril()
    allowed = (sequences[:, :, None] == sequences[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=dtype, device=sequences.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def default_seq_len(config: Any) -> int:
    """A training length for a transformers config: its max_position_embeddings, at most 4096 (long-context
    models advertise 128k positions that no fine-tuning batch should default to)."""
    return min(getattr(config, "max_position_embeddings", None) or 2048, 4096)

