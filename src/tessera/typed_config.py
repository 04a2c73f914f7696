"""What every layer's typed config shares (the Trainer's settings, a Stream's arguments, a recipe): one
line per error naming the key, and the check of a storage URL, so a bad value reads the same wherever it
was given."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError, ValidationInfo

from tessera.storage.errors import StorageError
from tessera.storage.url import parse_url
from tessera.suggest import meant


def storage_url(value: Any, info: ValidationInfo) -> Any:
    """A storage URL or local path whose scheme Tessera can open. No I/O: a missing bucket is found when the
    layer opens it. `{run_name}` (a save folder's placeholder) is allowed."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        try:
            parse_url(value.replace("{run_name}", "run"))
        except StorageError as exc:
            raise ValueError(f"{info.field_name}: {exc}") from None
    return value


def error_lines(exc: ValidationError, did_you_mean: Callable[[tuple[Any, ...]], str] | None = None) -> list[str]:
    """`key: problem` lines. A check whose message already starts with its field's name keeps its wording,
    with the name widened to the full dotted key (`remote ...` -> `data.train.streams.0.remote ...`)."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            close = did_you_mean(loc) if did_you_mean else ""
            lines.append(f"unknown key {key!r}" + (f"; {meant(close)}" if close else ""))
        elif err["type"] == "missing":
            lines.append(f"missing key {key!r}")
        elif err["type"] == "value_error":  # our own checks: the message already names the value
            msg = err["msg"].removeprefix("Value error, ")
            name = str(loc[-1]) if loc else ""
            if name and msg.startswith(name) and msg[len(name):len(name) + 1] in ("", " ", ":"):
                lines.append(key + msg[len(name):])
            else:
                lines.append(f"{key}: {msg}" if key else msg)
        else:
            lines.append(f"{key}: {err['msg']} (got {err.get('input')!r})" if key else err["msg"])
    return lines


def one_message(exc: ValidationError) -> str:
    """The errors as one string: one line, or a list when several keys are wrong at once."""
    lines = error_lines(exc)
    return lines[0] if len(lines) == 1 else "; ".join(lines)
