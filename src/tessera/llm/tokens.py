"""The `tokens` column as the model reads it: Tessera's windows, and LLM Foundry's two token encodings.

`tessera llm prep` writes `tokens` as `ndarray:uint16:L` (or uint32): fixed-size windows that the batch
path stacks as they are. LLM Foundry's `convert_dataset_hf.py --concat_tokens L` writes them two other
ways, and a user switching should be able to train on what they already have:
- newer Foundry: `ndarray:int32` (dtype in the column, shape in each sample): one 1-D array per sample;
- older Foundry (`ConcatTokensDataset` before mid-2024): `bytes`, the raw bytes of an int64 array
  (`np.asarray(ids).tobytes()`), read back with its `token_encoding_type` (default int64).
Both are variable-size columns, so the batch path hands them over as lists; `TokenWindows` (the loader's
collate) turns each batch into the [B, L] int64 tensor the model takes. As Foundry does, a longer
sample is cut to the model's L; a shorter one is an error here (Foundry would pad it, but pre-training
on a padded window is a silent change of the data, and Tessera's model has no attention mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tessera.llm.finetune.batch import ExampleBatch, rows_batch
from tessera.llm.recipe import RecipeError
from tessera.llm.text_windows import TextWindows

# LLM Foundry's SUPPORTED_MDS_ENCODING_TYPES: the integer dtypes a token id may be stored as.
TOKEN_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


class TokenColumnError(RecipeError):
    """The dataset's `tokens` column cannot be read as token ids for this model (a recipe error: the
    data named by the recipe does not fit its model)."""


@dataclass(frozen=True)
class TokenWindows:
    """Collate of the batch path for variable-size token columns: [B, seq_len] int64 token ids.

    `bytes_dtype` is how `bytes` values decode (LLM Foundry's `token_encoding_type`); `seq_len=None`
    keeps every sample whole (they must then be of one length).
    """

    seq_len: int | None
    bytes_dtype: str = "int64"

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        values = batch["tokens"]
        if isinstance(values, np.ndarray) and values.ndim == 2:  # stacked already (fixed-size shards)
            rows = values[:, :self.seq_len]
        else:
            rows = np.stack([self.row(v) for v in values])
        return {**batch, "tokens": torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))}

    def row(self, value: Any) -> np.ndarray:
        """One sample's first seq_len token ids."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            size = np.dtype(self.bytes_dtype).itemsize
            if len(value) % size:
                raise TokenColumnError(f"a `tokens` value of {len(value)} bytes is not a whole number of "
                                       f"{self.bytes_dtype} token ids (data.*.token_encoding_type)")
            value = np.frombuffer(value, dtype=self.bytes_dtype)
        array = np.asarray(value)
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise TokenColumnError(f"a `tokens` value is a {array.dtype} array of shape {array.shape}; "
                                   "expected a 1-D array of integer token ids")
        if self.seq_len is not None and len(array) < self.seq_len:
            raise TokenColumnError(f"a `tokens` sample holds {len(array)} token ids but model.max_seq_len is "
                                   f"{self.seq_len}; prepare the data with windows of at least that length")
        return array[:self.seq_len]


def token_collate(encodings: Sequence[tuple[str, str | None]], seq_len: int | None,
                  bytes_dtype: str = "int64") -> TokenWindows | None:
    """How batches of these streams' `tokens` columns become model input: None when every stream holds
    fixed windows of exactly `seq_len` (any length when None) that stack as they are, else a
    `TokenWindows` collate.

    `encodings` is (stream label, encoding of its `tokens` column or None when it has none) per stream.
    Anything that is not integer token ids fails here, before any shard is read.
    """
    if bytes_dtype not in TOKEN_DTYPES:
        raise TokenColumnError(f"token_encoding_type={bytes_dtype!r} is not one of {list(TOKEN_DTYPES)}")
    kinds = {label: _kind(label, encoding, seq_len) for label, encoding in encodings}
    if len({encoding for _, encoding in encodings}) > 1:
        found = ", ".join(f"{label}: {encoding}" for label, encoding in encodings)
        raise TokenColumnError(f"data: the streams store `tokens` differently ({found}); a batch mixes "
                               "streams, so they must share one encoding (re-prepare or convert one of them)")
    return TokenWindows(seq_len, bytes_dtype) if "variable" in kinds.values() else None


def stream_collate(streams: Sequence[Any], seq_len: int | None, bytes_dtype: str = "int64",
                   section: str = "data", tokenizer: Any = None) -> TokenWindows | ExampleBatch | TextWindows | None:
    """How batches of these loaded streams become model input, read off their index's columns:
    fine-tuning rows (`tessera llm prep --format chat|instruction|text`: tokens, loss_mask and the packed
    or padded columns) through `ExampleBatch`, the collate of `data.*.path`, so they keep their labels;
    a `text` column without `tokens` (LLM Foundry's text MDS) tokenized by `TextWindows`; token windows
    as `token_collate` says. A batch mixes streams, so streams of different kinds are refused, naming
    each with its columns."""
    loaded = [st for st in streams if st.entries]
    texts = ["text" in st.entries[0].column_names and "tokens" not in st.entries[0].column_names for st in loaded]
    if loaded and all(texts) and tokenizer is not None and seq_len is not None:
        return TextWindows(tokenizer, seq_len)
    kinds = {}
    for st in loaded:
        try:
            kinds[st.label] = rows_batch(st.entries[0].column_names)
        except ValueError as exc:
            raise TokenColumnError(f"{section}.streams: {st.label}: {exc}") from None
    if len(set(kinds.values())) > 1:
        found = "; ".join(f"{st.label}: {', '.join(st.entries[0].column_names)}" for st in loaded)
        raise TokenColumnError(f"{section}.streams: the streams hold different columns ({found}); a batch mixes "
                               "streams, so they must be all token windows, all packed fine-tuning rows or all "
                               "padded ones")
    collate = token_collate([(st.label, tokens_encoding(st.entries)) for st in loaded], seq_len, bytes_dtype)
    rows = next(iter(kinds.values()), None)
    if rows is None:
        return collate
    if collate is not None:
        raise TokenColumnError(f"{section}.streams: fine-tuning rows are read as `tessera llm prep` writes them, "
                               f"fixed windows of the model's max_seq_len ({seq_len}); these vary in length")
    return rows


def tokens_encoding(entries: Sequence[Any]) -> str | None:
    """The encoding of the `tokens` column in these shard entries (index.json), None if there is none."""
    for entry in entries[:1]:
        if "tokens" in entry.column_names:
            return entry.column_encodings[entry.column_names.index("tokens")]
    return None


def _kind(label: str, encoding: str | None, seq_len: int | None) -> str:
    """'fixed' (windows of seq_len that stack as they are) or 'variable' (decoded by TokenWindows)."""
    if encoding is None:
        raise TokenColumnError(f"{label}: the dataset has no `tokens` column; train on token ids "
                               "(tessera llm prep, or LLM Foundry's convert_dataset_hf.py --concat_tokens)")
    if encoding == "bytes":
        return "variable"
    parts = encoding.split(":")
    if parts[0] != "ndarray" or len(parts) > 3 or (len(parts) > 1 and parts[1] not in TOKEN_DTYPES):
        raise TokenColumnError(f"{label}: column `tokens` is {encoding}; Tessera trains on integer token ids "
                               f"stored as ndarray[:{'|'.join(TOKEN_DTYPES)}[:L]] or as LLM Foundry's bytes")
    if len(parts) < 3:
        return "variable"  # dtype and/or shape in each sample (LLM Foundry's ndarray:int32)
    if seq_len is not None and parts[2] != str(seq_len):
        raise TokenColumnError(f"{label}: the shards hold {encoding} windows but model.max_seq_len is "
                               f"{seq_len}; prepare the data with --seq-len equal to the model's max_seq_len")
    return "fixed"
