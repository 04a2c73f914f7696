"""Human byte sizes ("64mb", "1.5gb", 4096) in binary units, as MDS size limits are written."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50,
          "e": 1 << 60, "z": 1 << 70, "y": 1 << 80}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtpezy]?)(i?b)?\s*$")


def parse_size(value: int | float | str) -> int:
    """Bytes from an int or a string such as "64mb", "64MiB", "100kb", "512b", "1024" (kb = 1024).

    ValueError names the bad value; the unit letters are case-insensitive.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}")
    if isinstance(value, int | float):
        return int(value)
    match = _PATTERN.match(str(value).lower())
    if not match or (match.group(2) == "" and match.group(3) == "ib"):
        raise ValueError(f"invalid size {value!r}: use bytes or a number with kb, mb, gb, tb (binary units)")
    number, unit = match.group(1), match.group(2)
    return int(float(number) * _UNITS[unit]) if "." in number else int(number) * _UNITS[unit]
