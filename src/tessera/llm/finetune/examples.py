"""One record of a fine-tuning file to token ids and a loss mask.

Record forms (one JSONL line or Parquet row each):
- `chat`: `{"messages": [{"role": "system"|"user"|"assistant"|..., "content": str}, ...]}`, rendered through
  the tokenizer's chat template (`chat.py`);
- `instruction`: `{"prompt": str, "response": str}` (LLM Foundry's), tokenized as prompt then response,
  each on its own, as Foundry does;
- `text`: `{"text": str}` (another field with `text_field`);
- `auto`: the form is read off each record's keys (messages, then prompt + response, then text).

Which tokens carry loss (`loss_on`):
- `all_assistant` (default): every assistant reply (in `instruction`, the response);
- `last_assistant`: only the conversation's last assistant reply (in `instruction`, the response);
- `all`: every token. `text` records always train on every token.
An assistant reply includes the template's end-of-turn marker, so the model learns to stop. EOS is
appended to every example (it carries loss when the example's last segment does), so generation can
stop on the tokenizer's EOS whatever the template.

The loss mask is aligned with the tokens: `loss[t]` says token t is a target (predicted from tokens
< t). Token 0 of an example is never a target: nothing before it belongs to the example, so in a packed
row no prediction reaches across two examples.

Examples longer than the context (`truncation`): `prompt_first` (default) drops tokens from the start
of the example (the oldest context: the prompt, earlier turns) but not into its last loss-carrying
segment; if that segment still does not fit, its end is cut. `drop` leaves the example out. Either way
the prep summary counts them, and an example left without any target token is dropped and counted.

A text far longer than the context is cut before it is tokenized (`bounded`), so a record of megabytes
costs tokenizer memory for the context's worth, not for the whole: each text keeps the end the
truncation keeps (a prompt or earlier turn its end, the last reply and what follows it their start), as
many characters as give the context plus a margin of tokens, so the tokens that end up in the row are
the ones the whole text gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tessera.llm.finetune.chat import ExampleTokenizer
from tessera.llm.finetune.rows import ExampleError, InstructionRow, Row, TextRow, parse_row

Format = Literal["auto", "chat", "instruction", "text"]
LossOn = Literal["all_assistant", "last_assistant", "all"]
Truncation = Literal["prompt_first", "drop"]
FORMATS: tuple[str, ...] = ("auto", "chat", "instruction", "text")
CUT_MARGIN = 64  # tokens kept beyond the row where a long text is cut: those next to the cut may differ
CHARS_PER_TOKEN = 8  # a first guess at the characters that give a token, when a long text is cut


@dataclass
class Encoded:
    """One example: token ids and, aligned with them, whether each token is a target."""

    tokens: np.ndarray  # int64
    loss: np.ndarray  # bool
    truncated: bool = False


def _segments(row: Row, tok: ExampleTokenizer, loss_on: str) -> tuple[list[tuple[list[int], bool]], bool]:
    """(token runs with their loss flag, whether the last run is a reply) of one row."""
    if isinstance(row, TextRow):
        return [(tok.encode(row.text), True)], True
    if isinstance(row, InstructionRow):
        return [(tok.encode(row.prompt), loss_on == "all"), (tok.encode(row.response), True)], True
    messages = [m.for_template() for m in row.messages]
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    wanted = set(replies[-1:] if loss_on == "last_assistant" else replies)
    segments = tok.segments(messages)
    if segments is not None:
        runs = [(tok.encode(text), loss_on == "all" or (reply and index in wanted))
                for text, reply, index in segments]
        return runs, bool(segments) and segments[-1][1]
    ids, mask = tok.assistant_mask(messages)
    runs = _mask_runs(ids, mask)
    if loss_on != "all":
        reply_runs = [i for i, (_, is_reply) in enumerate(runs) if is_reply]
        keep = set(reply_runs[-1:] if loss_on == "last_assistant" else reply_runs)
        runs = [(ids_, i in keep) for i, (ids_, _) in enumerate(runs)]
    else:
        runs = [(ids_, True) for ids_, _ in runs]
    return runs, bool(mask) and bool(mask[-1])


def _mask_runs(ids: list[int], mask: list[int]) -> list[tuple[list[int], bool]]:
    runs: list[tuple[list[int], bool]] = []
    for token, flag in zip(ids, mask, strict=True):
        if runs and runs[-1][1] == bool(flag):
            runs[-1][0].append(token)
        else:
            runs.append(([token], bool(flag)))
    return runs


def encode_record(record: Any, fmt: str, tok: ExampleTokenizer, *, loss_on: str = "all_assistant",
                  text_field: str = "text", where: str = "record") -> Encoded:
    """Token ids and loss mask of one record (checked by `rows.parse_row`; ExampleError names `where`)."""
    try:
        row = parse_row(record, fmt, text_field)
    except ExampleError as exc:
        raise ExampleError(f"{where}: {exc}") from None
    return encode_row(row, tok, loss_on)


def encode_row(row: Row, tok: ExampleTokenizer, loss_on: str = "all_assistant") -> Encoded:
    """Token ids and loss mask of one row (module docstring), EOS appended, token 0 never a target."""
    runs, ends_with_reply = _segments(row, tok, loss_on)
    runs = [r for r in runs if r[0]]
    eos_loss = runs[-1][1] if runs and ends_with_reply else loss_on == "all"
    if not runs or runs[-1][0][-1] != tok.eos_id:
        runs.append(([tok.eos_id], eos_loss))
    tokens = np.concatenate([np.asarray(ids, dtype=np.int64) for ids, _ in runs])
    loss = np.concatenate([np.full(len(ids), flag, dtype=bool) for ids, flag in runs])
    loss[0] = False
    return Encoded(tokens, loss)


def bounded(row: Row, tok: ExampleTokenizer, seq_len: int, loss_on: str) -> Row:
    """`row` with every text far longer than `seq_len` tokens cut to the end the truncation keeps (module
    docstring); the row itself when none is."""
    need = seq_len + CUT_MARGIN
    if isinstance(row, TextRow):
        return row.model_copy(update={"text": _cut(row.text, tok, need, keep_end=False)})
    if isinstance(row, InstructionRow):
        prompt = _cut(row.prompt, tok, need, keep_end=loss_on != "all")
        return row.model_copy(update={"prompt": prompt, "response": _cut(row.response, tok, need, keep_end=False)})
    # the window ends in the last reply: what comes before it keeps its end; with loss on all, the start
    replies = [i for i, m in enumerate(row.messages) if m.role == "assistant"]
    last = replies[-1] if replies and loss_on != "all" else 0
    messages = [m if m.content is None else m.model_copy(update={"content": _cut(m.content, tok, need, i < last)})
                for i, m in enumerate(row.messages)]
    return row.model_copy(update={"messages": messages})


def _cut(text: str, tok: ExampleTokenizer, need: int, keep_end: bool) -> str:
    """`text`, or its last (`keep_end`) or first characters that give at least `need` tokens: tried with
    CHARS_PER_TOKEN characters a token, then four times more while they give fewer."""
    size = need * CHARS_PER_TOKEN
    while size < len(text):
        piece = text[-size:] if keep_end else text[:size]
        if len(tok.encode(piece)) >= need:
            return piece
        size *= 4
    return text


def fit(example: Encoded, seq_len: int, truncation: str) -> Encoded | None:
    """The example within `seq_len` tokens (module docstring), or None when it is dropped."""
    n = len(example.tokens)
    if n <= seq_len:
        return example
    if truncation == "drop":
        return None
    loss = example.loss
    # the start of the last loss-carrying segment: the first target after the last non-target before it
    targets = np.flatnonzero(loss)
    if len(targets):
        before = np.flatnonzero(~loss[:targets[-1]])
        last_start = int(before[-1]) + 1 if len(before) else 0
        # keep the token before the segment as its context: the segment's first token is then a target
        start = min(n - seq_len, max(last_start - 1, 0))
    else:
        start = n - seq_len
    tokens, loss = example.tokens[start:start + seq_len], loss[start:start + seq_len].copy()
    loss[0] = False
    return Encoded(tokens, loss, truncated=True)


__all__ = ["FORMATS", "Encoded", "ExampleError", "bounded", "encode_record", "encode_row", "fit"]
