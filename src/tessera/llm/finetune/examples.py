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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tessera.llm.finetune.chat import ExampleTokenizer

Format = Literal["auto", "chat", "instruction", "text"]
LossOn = Literal["all_assistant", "last_assistant", "all"]
Truncation = Literal["prompt_first", "drop"]
FORMATS: tuple[str, ...] = ("auto", "chat", "instruction", "text")


class ExampleError(ValueError):
    """A record is not an example of the expected form; the message names the record and the fix."""


@dataclass
class Encoded:
    """One example: token ids and, aligned with them, whether each token is a target."""

    tokens: np.ndarray  # int64
    loss: np.ndarray  # bool
    truncated: bool = False


def record_format(record: dict[str, Any], fmt: str, text_field: str, where: str) -> str:
    """The form of `record`: `fmt` itself, checked, or the one its keys say when `fmt` is auto."""
    if fmt == "auto":
        if "messages" in record:
            return "chat"
        if "prompt" in record and "response" in record:
            return "instruction"
        if text_field in record:
            return "text"
        raise ExampleError(f"{where}: a record with fields {sorted(record)} is none of chat ('messages'), "
                           f"instruction ('prompt' and 'response') or text ({text_field!r})")
    needed = {"chat": ["messages"], "instruction": ["prompt", "response"], "text": [text_field]}[fmt]
    missing = [k for k in needed if k not in record]
    if missing:
        raise ExampleError(f"{where}: a {fmt} record needs field(s) {missing}; this one has {sorted(record)} "
                           "(choose the format with --format / data.*.format, or auto)")
    return fmt


def _text(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise ExampleError(f"{where}: {what} holds {type(value).__name__}, not text")
    return value


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list | tuple) or not value:
        raise ExampleError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ExampleError(f"{where}: messages[{i}] must be an object with a 'role' and a 'content'")
        if m["content"] is not None:  # None: a tool-call turn, whose template writes the call
            _text(m["content"], f"messages[{i}].content", where)
        out.append(dict(m))
    return out


def _segments(record: dict[str, Any], fmt: str, tok: ExampleTokenizer, loss_on: str, text_field: str,
              where: str) -> tuple[list[tuple[list[int], bool]], bool]:
    """(token runs with their loss flag, whether the last run is a reply) of one record."""
    if fmt == "text":
        return [(tok.encode(_text(record[text_field], repr(text_field), where)), True)], True
    if fmt == "instruction":
        prompt = tok.encode(_text(record["prompt"], "'prompt'", where))
        response = tok.encode(_text(record["response"], "'response'", where))
        return [(prompt, loss_on == "all"), (response, True)], True
    messages = _messages(record["messages"], where)
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


def encode_record(record: dict[str, Any], fmt: str, tok: ExampleTokenizer, *, loss_on: str = "all_assistant",
                  text_field: str = "text", where: str = "record") -> Encoded:
    """Token ids and loss mask of one record (module docstring), EOS appended, token 0 never a target."""
    if not isinstance(record, dict):
        raise ExampleError(f"{where}: a record must be an object, got {type(record).__name__}")
    kind = record_format(record, fmt, text_field, where)
    runs, ends_with_reply = _segments(record, kind, tok, loss_on, text_field, where)
    runs = [r for r in runs if r[0]]
    eos_loss = runs[-1][1] if runs and ends_with_reply else loss_on == "all"
    if not runs or runs[-1][0][-1] != tok.eos_id:
        runs.append(([tok.eos_id], eos_loss))
    tokens = np.concatenate([np.asarray(ids, dtype=np.int64) for ids, _ in runs])
    loss = np.concatenate([np.full(len(ids), flag, dtype=bool) for ids, flag in runs])
    loss[0] = False
    return Encoded(tokens, loss)


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
