"""The batch a fine-tuning loader yields, from the rows prep wrote (`packing.py`).

Every batch holds, as int64 tensors of shape [B, L]:
- `tokens`: token ids (padding is the EOS id);
- `labels`: `tokens` where the token is a target, -100 elsewhere (prompt, padding, each example's first
  token), aligned with `tokens` as `GPT.loss` reads it (position t-1 predicts labels[t]);
and then either, for packed rows,
- `position_ids`: 0, 1, 2... restarting at every example (and at the padding run), and
- `sequence_ids`: the example's index within the row, -1 for padding;
or, for padded rows (one example each, padding on the right),
- `attention_mask`: 1 for the example's tokens, 0 for padding.

A model reads `tokens` and `labels`, and `position_ids` + `sequence_ids` when present (Tessera's GPT: a
block-diagonal causal mask and RoPE positions per example). A Hugging Face causal LM takes `tokens` as
`input_ids`, `labels` shifted as it shifts them itself, and `position_ids` for packed rows (with no
`attention_mask`: transformers then finds the packed sequences from the position resets, for
flash-attention and SDPA alike) or `attention_mask` for padded ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tessera.llm.model import IGNORE_INDEX

PACKED_COLUMNS = ["tokens", "loss_mask", "position_ids", "sequence_ids"]
PADDED_COLUMNS = ["tokens", "loss_mask", "attention_mask"]


def _tensor(values: Any) -> torch.Tensor:
    array = values if isinstance(values, np.ndarray) else np.stack([np.asarray(v) for v in values])
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))


@dataclass(frozen=True)
class ExampleBatch:
    """Collate of the batch path: the loader's stacked columns to the batch above."""

    packed: bool

    def __call__(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        tokens = _tensor(batch["tokens"])
        loss = _tensor(batch["loss_mask"]).bool()
        out = {"tokens": tokens, "labels": tokens.masked_fill(~loss, IGNORE_INDEX)}
        for name in ("position_ids", "sequence_ids") if self.packed else ("attention_mask",):
            out[name] = _tensor(batch[name])
        return out

    @property
    def columns(self) -> list[str]:
        return PACKED_COLUMNS if self.packed else PADDED_COLUMNS


def rows_batch(column_names: Sequence[str]) -> ExampleBatch | None:
    """The collate of a dataset with these columns when it holds fine-tuning rows (a `loss_mask` column:
    `tessera llm prep --format chat|instruction|text`), None for other data (token windows).
    ValueError when a `loss_mask` comes without the columns of packed or of padded rows."""
    names = set(column_names)
    if "loss_mask" not in names:
        return None
    for packed, needed in ((True, PACKED_COLUMNS), (False, PADDED_COLUMNS)):
        if names.issuperset(needed):
            return ExampleBatch(packed=packed)
    raise ValueError(f"columns {', '.join(column_names)}: fine-tuning rows (loss_mask) also need either "
                     f"{', '.join(PACKED_COLUMNS[2:])} (packed) or {PADDED_COLUMNS[2]} (padded)")


def padding_share(batch: dict[str, torch.Tensor]) -> float:
    """The share of a batch's tokens that are padding."""
    if "attention_mask" in batch:
        real = batch["attention_mask"].sum().item()
    else:
        real = (batch["sequence_ids"] >= 0).sum().item()
    total = batch["tokens"].numel()
    return (total - real) / total
