"""Human numbers as MosaicML Streaming reads them: byte sizes ("64mb") and sample counts ("1k").

The two kinds differ, as in Mosaic: a byte size uses binary units (kb = 1024, Mosaic's `bytes_to_int`,
used for `size_limit` and `cache_limit`), a sample count uses decimal ones (k = 1,000, m, b = 10**9, t,
Mosaic's `number_abbrev_to_int`, used for `epoch_size`). Every string Mosaic accepts gives the same value
here (same float arithmetic too, so even "1.3gb" rounds alike), so a switched user's settings mean what
they meant. Byte sizes also take a few spellings Mosaic refuses ("64MiB", "64m", "2 b", "1.5"); counts
take exactly Mosaic's. Negative results, NaN and infinity are refused with a ValueError naming the value.
"""

from __future__ import annotations

import math

_BINARY = {letter: 1 << (10 * power) for power, letter in enumerate("kmgtpezy", start=1)}
# Longest suffix first, so "5kib" is not read as "5ki" + "b".
_SIZE_SUFFIXES = ([(f"{k}ib", v) for k, v in _BINARY.items()] + [(f"{k}b", v) for k, v in _BINARY.items()]
                  + list(_BINARY.items()) + [("b", 1)])
_COUNT_SUFFIXES = [("k", 10**3), ("m", 10**6), ("b", 10**9), ("t", 10**12)]


def _from_number(value: int | float, what: str) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"invalid {what} {value!r}: not a finite number")
    if value < 0:
        raise ValueError(f"invalid {what} {value!r}: must not be negative")
    return int(value)


def _scaled(number: str, scale: int, value: object, what: str, hint: str) -> int:
    """int(float(number) * scale) as Mosaic computes it; digits alone with scale 1 stay exact."""
    number = number.strip()
    if scale == 1 and number.isdecimal():
        return int(number)
    try:
        scaled = float(number) * scale
    except ValueError:
        raise ValueError(f"invalid {what} {value!r}: {hint}") from None
    if not math.isfinite(scaled):
        raise ValueError(f"invalid {what} {value!r}: not a finite number")
    result = int(scaled)
    if result < 0:
        raise ValueError(f"invalid {what} {value!r}: must not be negative")
    return result


def _parse(value: object, what: str, hint: str, suffixes: list[tuple[str, int]], plain: bool) -> int:
    """A number, or a string: an optional suffix from `suffixes`, else digits alone (any number when
    `plain`), scaled as Mosaic scales it."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"invalid {what} {value!r}: {hint}")
    if not isinstance(value, str):
        return _from_number(value, what)
    text = value.lower().strip()
    for suffix, scale in suffixes:
        if text.endswith(suffix) and text != suffix:
            return _scaled(text[: -len(suffix)], scale, value, what, hint)
    if not (text if plain else text.isdigit()):
        raise ValueError(f"invalid {what} {value!r}: {hint}")
    return _scaled(text, 1, value, what, hint)


def parse_size(value: int | float | str) -> int:
    """Bytes from an int or a string such as "64mb", "64MiB", "100kb", "512b", "1024" (kb = 1024).

    Case-insensitive. Equal to Mosaic's `bytes_to_int` wherever that accepts the value.
    """
    return _parse(value, "size", "use bytes or a number with kb, mb, gb, tb (binary units)", _SIZE_SUFFIXES, True)


def parse_count(value: int | float | str) -> int:
    """A sample count from an int or a string such as "1k" (1,000), "2.5m", "1b" (10**9), "3t", "500".

    Exactly Mosaic's `number_abbrev_to_int` (decimal units, case-insensitive), which `epoch_size` uses;
    note "1k" is 1,000 samples while the byte size "1kb" is 1,024 bytes.
    """
    hint = "use a whole number, optionally with k (10**3), m (10**6), b (10**9) or t (10**12)"
    return _parse(value, "count", hint, _COUNT_SUFFIXES, False)
