"""Hiding credentials in what people see: run logs, metrics, events, `run describe`, the server's access log.

`Redactor` is the one mask: every place that shows a run's output passes it through one. A secret's value
is hidden in the forms a program is likely to print it in, not only as it is:
- URL-encoded: any character but an ASCII letter or digit may appear as %XX (either case), a space as '+';
- base64, standard or URL-safe alphabet, at each of the three byte alignments a value can have inside a
  longer encoded text (the characters that depend on its bytes alone), for values of MIN_BASE64_LEN
  characters or more (the encoding of a shorter one is a few characters ordinary text holds).
Tessera's API keys are found by their prefix whether or not they are stored as a secret: `tsk_` and its
URL-encoded form `tsk%5F` keep the prefix (`tsk_****`), a key inside base64 text becomes `****`.
"""

from __future__ import annotations

import base64
import math
import re
from typing import Any

REDACTED = "****"
MIN_REDACT_LEN = 4    # shorter values would turn every log line into asterisks; documented in platform.md
MIN_BASE64_LEN = 8
API_KEY_PREFIX = "tsk_"
_KEY_CHAR = r"(?:[A-Za-z0-9-]|_|%5[Ff]|%2[Dd])"     # a key's URL-safe alphabet, '_' and '-' maybe encoded
_BASE64_CHAR = r"[A-Za-z0-9+/_-]"
_KEY_BASE64_TAIL = 40   # base64 characters after the prefix's: a whole key (43 characters) gives ~57


def _encoded_char(char: str) -> str:
    """A pattern for `char` as it is or percent-encoded (each UTF-8 byte as %XX, hex in either case)."""
    if char.isascii() and char.isalnum():
        return char
    escapes = "".join("%" + "".join(f"[{h}{h.lower()}]" if h.isalpha() else h for h in f"{b:02X}")
                      for b in char.encode("utf-8"))
    plus = "|\\+" if char == " " else ""
    return f"(?:{re.escape(char)}|{escapes}{plus})"


def base64_forms(value: bytes) -> set[str]:
    """The base64 text `value` gives at each byte alignment (offset 0, 1, 2 in the encoded data), keeping
    only the characters no neighbouring byte changes; in both alphabets."""
    forms = set()
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + value).decode("ascii")
        stable = encoded[math.ceil(8 * offset / 6):(8 * (offset + len(value))) // 6]
        forms |= {stable, stable.replace("+", "-").replace("/", "_")}
    return {form for form in forms if form}


def _value_pattern(value: str) -> str:
    forms = [re.escape(form) for form in sorted(base64_forms(value.encode("utf-8")), key=len, reverse=True)]
    encoded = "".join(_encoded_char(c) for c in value)
    return "|".join([encoded, *forms]) if len(value) >= MIN_BASE64_LEN else encoded


def _key_patterns() -> str:
    prefixes = sorted(base64_forms(API_KEY_PREFIX.encode("ascii")), key=len, reverse=True)
    in_base64 = f"(?:{'|'.join(re.escape(p) for p in prefixes)}){_BASE64_CHAR}{{{_KEY_BASE64_TAIL},}}"
    return f"(?P<key>tsk(?:_|%5[Ff])){_KEY_CHAR}+|{in_base64}"


_KEYS = re.compile(_key_patterns())


def _replace(match: re.Match[str]) -> str:
    prefix = match.group("key")
    return f"{prefix}{REDACTED}" if prefix else REDACTED


def hide_api_keys(text: str) -> str:
    """`text` with every Tessera API key masked (for logs that hold no secret values, e.g. access logs)."""
    return _KEYS.sub(_replace, text)


class Redactor:
    """Replaces every known secret value (in each form above) and every API key in a text with ****."""

    def __init__(self, values: list[str]) -> None:
        usable = sorted({v for v in values if len(v) >= MIN_REDACT_LEN}, key=len, reverse=True)
        self._pattern = re.compile("|".join([*(_value_pattern(v) for v in usable), _key_patterns()]))

    def __call__(self, text: str) -> str:
        return self._pattern.sub(_replace, text) if text else text

    def json(self, value: Any) -> Any:
        """A JSON value (a metrics row) with every string in it masked, keys included; a number whose
        text is a secret value is masked too. Other numbers are measurements, kept as they are."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {self(str(k)): self.json(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.json(v) for v in value]
        if isinstance(value, int | float) and not isinstance(value, bool) and self(str(value)) == REDACTED:
            return REDACTED
        return value
