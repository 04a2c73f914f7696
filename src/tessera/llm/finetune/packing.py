"""Examples to rows of the context length: packed several to a row, or one per row and padded.

Packed rows keep attention inside each example. A row carries, besides `tokens` and `loss_mask`:
- `position_ids`: 0, 1, 2... restarting at every example (what Hugging Face models read to find packed
  sequences, and where RoPE positions come from);
- `sequence_ids`: the example's index within the row (0, 0, 0, 1, 1...), -1 for padding, from which a
  model builds a block-diagonal causal mask.
The padding at the end of a packed row is a sequence of its own (positions restart, sequence id -1), so
no example attends to it. Padded rows (one example each, padding at the end) carry `attention_mask`
(1 for the example's tokens, 0 for padding): with padding on the right a causal model may ignore it.
Padding tokens are `pad_id` and are never targets.

Packing is first-fit over a few open rows, in input order (`open_rows`; 1 is plain greedy): an example
goes into the first open row it fits; when it fits none, the oldest open row is written and a new one
opened. It depends only on the examples' order and lengths, so prep's output does not depend on its
process count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

OPEN_ROWS = 8
PAD_SEQUENCE = -1


@dataclass
class Row:
    """One sample of seq_len tokens, as written to MDS."""

    columns: dict[str, np.ndarray]
    examples: int
    padding: int


@dataclass(eq=False)  # rows are told apart by identity
class _Open:
    tokens: list[np.ndarray] = field(default_factory=list)
    losses: list[np.ndarray] = field(default_factory=list)
    used: int = 0


def pack_columns(seq_len: int, token_dtype: np.dtype) -> dict[str, str]:
    """The MDS columns of packed rows."""
    return {"tokens": f"ndarray:{token_dtype.name}:{seq_len}", "loss_mask": f"ndarray:uint8:{seq_len}",
            "position_ids": f"ndarray:int32:{seq_len}", "sequence_ids": f"ndarray:int32:{seq_len}"}


def pad_columns(seq_len: int, token_dtype: np.dtype) -> dict[str, str]:
    """The MDS columns of padded rows."""
    return {"tokens": f"ndarray:{token_dtype.name}:{seq_len}", "loss_mask": f"ndarray:uint8:{seq_len}",
            "attention_mask": f"ndarray:uint8:{seq_len}"}


def _first_not_target(loss: np.ndarray) -> np.ndarray:
    """The mask with the example's first token not a target: nothing of the example comes before it."""
    if loss[0]:
        loss = loss.copy()
        loss[0] = False
    return loss


class RowBuilder:
    """Turns examples (token ids, loss mask; each at most seq_len long) into rows (module docstring)."""

    def __init__(self, seq_len: int, pad_id: int, token_dtype: np.dtype, pack: bool = True,
                 open_rows: int = OPEN_ROWS) -> None:
        if open_rows < 1:
            raise ValueError(f"open_rows must be at least 1, got {open_rows}")
        self.seq_len, self.pad_id, self.dtype, self.pack = seq_len, pad_id, token_dtype, pack
        self.open_rows = open_rows if pack else 1
        self.rows: list[_Open] = []
        self.written = 0
        self.padding_tokens = 0

    def add(self, tokens: np.ndarray, loss: np.ndarray) -> Iterator[Row]:
        """Rows completed by this example (none, or one or two)."""
        n = len(tokens)
        if not 0 < n <= self.seq_len:
            raise ValueError(f"an example of {n} tokens does not fit rows of {self.seq_len}")
        if not self.pack:
            yield self._row(_Open([tokens], [_first_not_target(loss)], n))
            return
        target = next((r for r in self.rows if r.used + n <= self.seq_len), None)
        if target is None:
            if len(self.rows) >= self.open_rows:
                yield self._row(self.rows.pop(0))
            target = _Open()
            self.rows.append(target)
        target.tokens.append(tokens)
        target.losses.append(_first_not_target(loss))
        target.used += n
        if target.used == self.seq_len:
            self.rows.remove(target)
            yield self._row(target)

    def finish(self) -> Iterator[Row]:
        """The rows still open, in the order they were opened."""
        while self.rows:
            yield self._row(self.rows.pop(0))

    def _row(self, row: _Open) -> Row:
        L, pad = self.seq_len, self.seq_len - row.used
        tokens = np.full(L, self.pad_id, dtype=self.dtype)
        tokens[:row.used] = np.concatenate(row.tokens)
        loss = np.zeros(L, dtype=np.uint8)
        loss[:row.used] = np.concatenate(row.losses)
        self.written += 1
        self.padding_tokens += pad
        if not self.pack:
            attention = np.zeros(L, dtype=np.uint8)
            attention[:row.used] = 1
            return Row({"tokens": tokens, "loss_mask": loss, "attention_mask": attention}, 1, pad)
        lengths = [len(t) for t in row.tokens] + ([pad] if pad else [])
        positions = np.concatenate([np.arange(n, dtype=np.int32) for n in lengths])
        sequences = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
        if pad:
            sequences[row.used:] = PAD_SEQUENCE
        return Row({"tokens": tokens, "loss_mask": loss, "position_ids": positions, "sequence_ids": sequences},
                   len(row.tokens), pad)
