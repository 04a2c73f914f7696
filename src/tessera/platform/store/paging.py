"""Cursors of the paged lists (runs, audit entries, events): opaque to clients, stable under inserts.

A cursor holds the sort key of the last row of a page (for runs: created time and id; for entries and
events: the id), and the next page is the rows strictly after it in the list's order. Rows inserted
meanwhile therefore never shift a page (as an offset would): no row is shown twice or skipped.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, TypeVar

T = TypeVar("T")
Page = tuple[list[T], str | None]      # (rows, the cursor of the next page or None at the end)
MAX_LIMIT = 1000


def encode_cursor(*key: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key), separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, types: tuple[type, ...]) -> tuple[Any, ...]:
    """The key a cursor holds, each part checked against `types`; ValueError naming the cursor if it is
    not one this store made."""
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        key = None
    if not (isinstance(key, list) and len(key) == len(types)
            and all(_fits(part, kind) for part, kind in zip(key, types, strict=True))):
        raise ValueError(f"cursor {cursor[:40]!r} is not a cursor of this list (pass the next_cursor of the "
                         "previous page)")
    assert isinstance(key, list)
    return tuple(float(p) if kind is float else p for p, kind in zip(key, types, strict=True))


def _fits(part: Any, kind: type) -> bool:
    if isinstance(part, bool):
        return False
    return isinstance(part, (int, float) if kind is float else kind)


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be 1..{MAX_LIMIT}, got {limit!r}")
    return limit
