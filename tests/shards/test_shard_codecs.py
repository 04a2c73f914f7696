"""Compression strings and streams, digests, and human size limits."""

from __future__ import annotations

import bz2
import gzip
import hashlib

import brotli
import pytest
import snappy
import xxhash
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.shards.compression import parse_compression, valid_compressions
from tessera.shards.hashing import HASH_ALGORITHMS, Digests, hash_hex, normalize_hashes
from tessera.shards.sizes import parse_size

DATA = b"tessera " * 3000 + bytes(range(256))


@pytest.mark.parametrize("text", valid_compressions())
def test_every_compression_roundtrips(text: str) -> None:
    codec = parse_compression(text)
    assert codec is not None and codec.text == text
    packed = codec.compress(DATA)
    assert codec.decompress(packed) == DATA
    assert codec.extension == text.partition(":")[0]


@pytest.mark.parametrize(
    ("text", "reference"),
    [
        ("zstd", lambda d: zstandard.ZstdCompressor(level=3).compress(d)),
        ("zstd:19", lambda d: zstandard.ZstdCompressor(level=19).compress(d)),
        ("br", lambda d: brotli.compress(d, quality=11)),
        ("br:0", lambda d: brotli.compress(d, quality=0)),
        ("bz2", lambda d: bz2.compress(d, 9)),
        ("bz2:1", lambda d: bz2.compress(d, 1)),
        ("snappy", snappy.compress),
    ],
)
def test_default_levels_and_streams(text: str, reference) -> None:
    assert parse_compression(text).compress(DATA) == reference(DATA)


def test_gzip_is_a_gzip_member_with_default_level_9() -> None:
    codec = parse_compression("gz")
    assert codec.level == 9
    assert gzip.decompress(codec.compress(DATA)) == DATA


def test_zstd_frame_records_content_size() -> None:
    frame = parse_compression("zstd").compress(DATA)
    assert zstandard.frame_content_size(frame) == len(DATA)


def test_zstd_without_content_size_still_decompresses() -> None:
    stream = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    frame = stream.compress(DATA) + stream.flush()
    assert parse_compression("zstd").decompress(frame) == DATA


@pytest.mark.parametrize("text", ["zstd:0", "zstd:23", "br:12", "bz2:0", "gz:10", "snappy:1", "lz4", "zstd:x"])
def test_invalid_compressions(text: str) -> None:
    with pytest.raises(ValueError, match="invalid compression"):
        parse_compression(text)


def test_no_compression() -> None:
    assert parse_compression(None) is None and parse_compression("") is None


@pytest.mark.parametrize("algo", sorted(HASH_ALGORITHMS))
def test_every_hash_matches_its_library(algo: str) -> None:
    if algo.startswith("xxh"):
        expected = getattr(xxhash, algo)(DATA).hexdigest()
    else:
        expected = hashlib.new(algo, DATA).hexdigest()
    assert hash_hex(algo, DATA) == expected == expected.lower()


def test_incremental_digests_equal_one_shot() -> None:
    digests = Digests(["sha256", "xxh3_64"])
    for start in range(0, len(DATA), 1000):
        digests.update(DATA[start : start + 1000])
    assert digests.hexdigests() == {"sha256": hash_hex("sha256", DATA), "xxh3_64": hash_hex("xxh3_64", DATA)}


def test_hash_names_sorted_unique_and_validated() -> None:
    assert normalize_hashes(["xxh64", "sha1", "xxh64"]) == ["sha1", "xxh64"]
    assert "xxh128" in HASH_ALGORITHMS and "xxh3_128" in HASH_ALGORITHMS
    assert not any(a.startswith("shake") for a in HASH_ALGORITHMS)
    with pytest.raises(ValueError, match="unsupported hash"):
        normalize_hashes(["shake_128"])


@pytest.mark.parametrize(
    ("text", "size"),
    [("64mb", 1 << 26), ("64MB", 1 << 26), ("64MiB", 1 << 26), ("100kb", 102400), ("1.5gb", 3 << 29),
     ("512b", 512), ("1024", 1024), (4096, 4096), (" 2 kb ", 2048), ("1tb", 1 << 40)],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "mb", "-1mb", "1xb", "ten", "1ib", True])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)  # type: ignore[arg-type]


@settings(max_examples=50)
@given(st.integers(0, 10**6), st.sampled_from(["kb", "mb", "gb", "KB", "b", ""]))
def test_parse_size_units_are_binary(number: int, unit: str) -> None:
    scale = {"kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "b": 1, "": 1}[unit.lower()]
    assert parse_size(f"{number}{unit}") == number * scale
