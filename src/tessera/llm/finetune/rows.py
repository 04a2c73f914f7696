"""The typed schema of a fine-tuning record: the one place a row is checked before it is encoded.

    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}  # chat
    {"prompt": "2+2?", "response": "4"}                                                          # instruction
    {"text": "..."}                                                                   # text (`text_field`)

A row that does not fit its form raises `ExampleError` with what is wrong and where inside the row
(`messages[1].content: null, not text`); the reader adds the file and line (`prep.py`). Checks are
pydantic models, strict (a number is not text, null is not text), so every path (prep, a recipe's
`path`, the tests) refuses the same rows with the same words.

Fields other than the form's own are kept (a message's `name`, `tool_calls`... reach the chat template)
or ignored (a record's `id`). A message's `content` may be null only in a tool-call turn (`tool_calls`
set), whose template writes the call; anywhere else null would be rendered as the text "None".
"""

from __future__ import annotations

import reprlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, model_validator

Role = Literal["system", "developer", "user", "assistant", "tool", "function", "ipython"]
_SHORT = reprlib.Repr()  # a value in a message is cut short: a row may hold megabytes
_SHORT.maxstring = _SHORT.maxother = 40


class ExampleError(ValueError):
    """A record is not a row of its form; the message says what is wrong, the caller says where."""


class _Row(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class Message(BaseModel):
    """One turn of a conversation. Other keys (name, tool_calls, tool_call_id) are kept for the template."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    role: Role
    content: StrictStr | None

    @model_validator(mode="after")
    def _null_only_for_tool_calls(self) -> Message:
        if self.content is None and not (self.model_extra or {}).get("tool_calls"):
            raise ValueError("content: null, not text (only a tool-call turn, with tool_calls, may have none)")
        return self

    def for_template(self) -> dict[str, Any]:
        return self.model_dump()


class ChatRow(_Row):
    messages: list[Message] = Field(min_length=1)


class InstructionRow(_Row):
    prompt: StrictStr
    response: StrictStr


class TextRow(_Row):
    text: StrictStr


Row = ChatRow | InstructionRow | TextRow
FORMS: dict[str, type[_Row]] = {"chat": ChatRow, "instruction": InstructionRow, "text": TextRow}


def row_form(record: dict[str, Any], fmt: str, text_field: str) -> str:
    """The form of `record`: `fmt` itself, or the one its keys say when `fmt` is auto."""
    if fmt != "auto":
        return fmt
    if "messages" in record:
        return "chat"
    if "prompt" in record and "response" in record:
        return "instruction"
    if text_field in record:
        return "text"
    raise ExampleError(f"a record with fields {sorted(record)[:8]} is none of chat ('messages'), instruction "
                   f"('prompt' and 'response') or text ({text_field!r})")


def parse_row(record: Any, fmt: str, text_field: str = "text") -> Row:
    """The typed row of one record (module docstring); ExampleError with the first thing wrong."""
    if not isinstance(record, dict):
        raise ExampleError(f"a record must be a JSON object, got {type(record).__name__}")
    form = row_form(record, fmt, text_field)
    needed = {"chat": ["messages"], "instruction": ["prompt", "response"], "text": [text_field]}[form]
    missing = [k for k in needed if k not in record]
    if missing:
        article = "an" if form == "instruction" else "a"
        raise ExampleError(f"{article} {form} record needs field(s) {missing}; this one has {sorted(record)[:8]} "
                       "(choose the format with --format / data.*.format, or auto)")
    values = {"text": record[text_field]} if form == "text" else record
    try:
        return FORMS[form].model_validate(values)
    except ValidationError as exc:
        raise ExampleError(_first_problem(exc, text_field if form == "text" else None)) from None


def _first_problem(exc: ValidationError, text_field: str | None) -> str:
    """`messages[1].content: null, not text`: the first error, its place in the row, the value cut short."""
    errors = exc.errors()
    first = errors[0]
    loc = [text_field if text_field and p == "text" else p for p in first["loc"]]
    # a union's branch (content: str | None) adds its type name to the location: not a place in the row
    loc = [p for p in loc if p not in ("str", "none")]
    place = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    value = first.get("input")
    if first["type"] == "value_error":  # our own check, worded as "field: problem"
        field, _, what = first["msg"].removeprefix("Value error, ").partition(": ")
        place = f"{place}.{field}" if place else field
    elif first["type"] == "missing":
        what = "missing"
    elif value is None:
        what = "null, not text" if first["type"] == "string_type" else f"null ({first['msg']})"
    else:
        what = f"{first['msg']} (got {_SHORT.repr(value)})"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"{place}: {what}{more}" if place else f"{what}{more}"


__all__ = ["FORMS", "ChatRow", "InstructionRow", "Message", "Role", "Row", "ExampleError", "TextRow", "parse_row",
           "row_form"]
