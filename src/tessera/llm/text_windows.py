"""A `text` column tokenized as batches are made: LLM Foundry's text dataloader over MDS of raw text.

Foundry's `name: text` loader reads either pre-tokenized `tokens` (llm/tokens.py) or a `text` column,
which it tokenizes per sample: truncated to max_seq_len and padded to it, the padding left out of the
loss. `TextWindows` does the same as the loader's collate, so `tessera train` trains on the MDS a
`convert_dataset_hf.py` run without `--concat_tokens` wrote:

    collate = TextWindows(tokenizer, seq_len=2048)
    batch = collate({"text": ["first document", "second"]})   # tokens, labels (-100 on padding), attention_mask

A transformers tokenizer encodes as Foundry calls it (`tokenizer(text)`, so with the special tokens it
adds, a BOS for Llama); Tessera's own encodes the text as it is. Padding is the tokenizer's pad token,
else its end-of-text token. Unlike Foundry's collator, which masks every token equal to the pad id, only
the padding added here is masked: an end-of-text token that ends a document stays a target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tessera.llm.model import IGNORE_INDEX


@dataclass(frozen=True)
class TextWindows:
    """Collate of the batch path for a `text` column: tokens [B, seq_len], labels and attention_mask."""

    tokenizer: Any
    seq_len: int

    columns = ["text"]

    def __call__(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        ids = [self.encode(text)[:self.seq_len] for text in batch["text"]]
        tokens = torch.full((len(ids), self.seq_len), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(ids), self.seq_len), dtype=torch.int64)
        for row, sample in enumerate(ids):
            tokens[row, :len(sample)] = torch.tensor(sample, dtype=torch.int64)
            mask[row, :len(sample)] = 1
        return {"tokens": tokens, "labels": tokens.masked_fill(mask == 0, IGNORE_INDEX), "attention_mask": mask}

    def encode(self, text: str) -> list[int]:
        if callable(self.tokenizer) and hasattr(self.tokenizer, "pad_token_id"):  # transformers
            return list(self.tokenizer(text)["input_ids"])
        return list(self.tokenizer.encode(text))

    @property
    def pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(self.tokenizer, "eos_token_id", None)
        return int(pad if pad is not None else self.tokenizer.eos_id)
