"""Byte sizes and sample counts parse as MosaicML Streaming parses them (`bytes_to_int`,
`number_abbrev_to_int`), checked against Mosaic's own functions on generated strings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anchors  # noqa: F401  (registers the torchvision stand-in, then imports streaming)
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from streaming.base.util import bytes_to_int, number_abbrev_to_int

from tessera.shards.sizes import parse_count, parse_size

MOSAIC_BYTE_UNITS = ("kb", "mb", "gb", "tb", "pb", "eb", "zb", "yb")


def _mosaic(fn: Any, value: Any) -> int | None:
    """Mosaic's value, or None where it refuses (any exception) or gives a negative number."""
    try:
        result = fn(value)
    except Exception:  # noqa: BLE001 - Mosaic raises ValueError, OverflowError, ...
        return None
    return result if result >= 0 else None


def _ours(fn: Any, value: Any) -> int | None:
    try:
        return fn(value)
    except ValueError:
        return None


_number = st.one_of(
    st.integers(0, 10**20).map(str),
    st.decimals(0, 10**6, places=4, allow_nan=False).map(str),
    st.floats(0, 1e12, allow_nan=False).map(repr),
    st.sampled_from(["1e3", "2E-2", "1_000", ".5", "5.", "-3", "-0.0001", "+7", "inf", "nan", "", "0x10", "١٢", "²"]),
)
_space = st.sampled_from(["", " ", "\t", "  "])


def _cased(unit: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(unit), max_size=len(unit)).map(
        lambda ups: "".join(c.upper() if up else c for c, up in zip(unit, ups, strict=True)))


def _spelled(units: list[str]) -> st.SearchStrategy[str]:
    unit = st.sampled_from(units).flatmap(_cased)
    return st.tuples(_space, _number, _space, unit, _space).map("".join)


_size_units = ["", "b", "ib", *MOSAIC_BYTE_UNITS, *"kmgtpezy", *(f"{u}ib" for u in "kmgtpezy"), "xb", "bb"]
SIZE_TEXT = st.one_of(_spelled(_size_units), st.text(alphabet="0123456789.kmgtbiKMGB -e_", max_size=8))
COUNT_TEXT = st.one_of(_spelled(["", "k", "m", "b", "t", "K", "kb", "x", "g"]),
                       st.text(alphabet="0123456789.kmbtKMBT -e_", max_size=8))


@settings(max_examples=400, deadline=None)
@given(SIZE_TEXT)
@example("64mb")
@example("1.3gb")
@example("-0.0001kb")
@example("infkb")
def test_parse_size_equals_mosaic_wherever_mosaic_accepts(text: str) -> None:
    theirs, ours = _mosaic(bytes_to_int, text), _ours(parse_size, text)
    if theirs is not None:
        assert ours == theirs, text
    elif text.lower().strip().endswith(MOSAIC_BYTE_UNITS):
        assert ours is None, text  # the same unit grammar as Mosaic's: refused alike
    else:
        assert ours is None or ours >= 0, text  # a spelling Mosaic refuses ("64MiB", "64m", "1.5")


@settings(max_examples=400, deadline=None)
@given(COUNT_TEXT)
@example("1k")
@example("1kb")
@example("2.5M")
@example("1b")
def test_parse_count_is_exactly_mosaic(text: str) -> None:
    assert _ours(parse_count, text) == _mosaic(number_abbrev_to_int, text), text


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.integers(0, 2**70), st.floats(0, 1e18, allow_nan=False, allow_infinity=False)))
def test_numbers_pass_through_as_mosaic(value: int | float) -> None:
    assert parse_size(value) == bytes_to_int(value)
    assert parse_count(value) == number_abbrev_to_int(value)


def test_count_and_size_units_differ_as_in_mosaic() -> None:
    assert parse_count("1k") == 1000 and parse_size("1kb") == 1024
    assert parse_count("1b") == 10**9 and parse_size("1b") == 1


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), True, None, "-1k", "k", "1.5x", "infk"])
def test_parse_count_refuses_with_the_value_named(bad: Any) -> None:
    with pytest.raises(ValueError, match="invalid count"):
        parse_count(bad)


def test_epoch_size_1k_is_1000_samples_as_in_mosaic(tmp_path: Path) -> None:
    from tessera.shards import ShardWriter
    from tessera.stream import StreamingDataset

    with ShardWriter(tmp_path / "ds", {"i": "int"}, size_limit="4kb") as writer:
        for i in range(1500):
            writer.write({"i": i})
    ds = StreamingDataset(local=str(tmp_path / "ds"), epoch_size="1k", batch_size=10)
    assert ds.epoch_size == 1000 and ds.size == 1500  # Mosaic: size = stored samples, epoch_size = weighted
    assert len([s["i"] for s in ds]) == 1000
