"""Shard compression: the five MDS families and their level strings ("zstd", "zstd:7", "br:11", ...).

A compressed shard is one stream over the whole raw shard file. The exact bytes matter: for the same
input and settings our shards are byte-identical to MosaicML's, so each family uses the same library
call with the same parameters (zstd through `zstandard`, a single frame with the content size).

Decompression is streamed in chunks and capped (`inflate`): a shard comes from untrusted storage, and a
few kilobytes can inflate to gigabytes, so memory must stay O(chunk) and the output must stop at the
size index.json declares instead of growing until the machine runs out.
"""

from __future__ import annotations

import bz2
import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

CHUNK = 1 << 20  # bytes of output (and of input read) per step of a streamed decompression


class InflateLimitError(ValueError):
    """A compressed stream inflates past the size it may have (a corrupt shard or a decompression bomb)."""

    def __init__(self, limit: int, seen: int) -> None:
        self.limit = limit
        self.seen = seen
        super().__init__(f"decompresses to more than {limit} bytes (stopped at {seen})")


@dataclass(frozen=True)
class Family:
    """A compression family: the name used as file extension, its levels and default level."""

    name: str
    levels: range | None  # None: the family has no levels (snappy)
    default: int | None


FAMILIES = {
    "br": Family("br", range(0, 12), 11),
    "bz2": Family("bz2", range(1, 10), 9),
    "gz": Family("gz", range(0, 10), 9),
    "snappy": Family("snappy", None, None),
    "zstd": Family("zstd", range(1, 23), 3),
}


@dataclass(frozen=True)
class Compression:
    """A parsed compression string. `text` is kept verbatim: it is what index.json records."""

    text: str
    family: str
    level: int | None

    @property
    def extension(self) -> str:
        """The file-name suffix of compressed shards (the family, without level)."""
        return self.family

    def compress(self, data: bytes | bytearray | memoryview) -> bytes:
        """Compress `data` into one stream of this family and level."""
        return _compress(self.family, self.level, data)

    def decompress(self, data: bytes | bytearray | memoryview) -> bytes:
        """Decompress one stream of this family (whole, in memory: only for data of trusted size)."""
        return _decompress(self.family, data)

    def inflate(self, src: BinaryIO, limit: int, chunk: int = CHUNK) -> Iterator[bytes]:
        """Decompress the stream read from `src` in pieces of at most `chunk` bytes.

        InflateLimitError as soon as the output passes `limit` bytes, so a bomb costs O(chunk) memory
        (snappy's raw block format cannot be streamed: its declared length is checked before decoding).
        """
        total = 0
        for piece in _PIECES[self.family](src, chunk, limit):
            total += len(piece)
            if total > limit:
                raise InflateLimitError(limit, total)
            yield piece


def valid_compressions() -> list[str]:
    """Every accepted compression string, for error messages and CLI help."""
    names = []
    for family in FAMILIES.values():
        names.append(family.name)
        names.extend(f"{family.name}:{level}" for level in family.levels or ())
    return names


def parse_compression(text: str | None) -> Compression | None:
    """Parse "family" or "family:level"; None/"" means no compression. ValueError lists what is valid."""
    if not text:
        return None
    name, sep, level_text = str(text).partition(":")
    family = FAMILIES.get(name)
    level: int | None = family.default if family else None
    valid = family is not None
    if valid and sep:
        valid = family.levels is not None and level_text.isdigit() and int(level_text) in family.levels
        level = int(level_text) if valid else None
    if not valid:
        raise ValueError(
            f"invalid compression {text!r}: use one of br[:0-11], bz2[:1-9], gz[:0-9], snappy, zstd[:1-22]"
        )
    return Compression(str(text), name, level)


def _compress(family: str, level: int | None, data: bytes | bytearray | memoryview) -> bytes:
    if family == "zstd":
        return zstandard.ZstdCompressor(level=level).compress(data)
    if family == "gz":
        return gzip.compress(data, level)  # type: ignore[arg-type]
    if family == "bz2":
        return bz2.compress(data, level)  # type: ignore[arg-type]
    if family == "br":
        import brotli

        return brotli.compress(bytes(data), quality=level)
    import snappy

    return snappy.compress(bytes(data))


def _decompress(family: str, data: bytes | bytearray | memoryview) -> bytes:
    if family == "zstd":
        try:
            return zstandard.ZstdDecompressor().decompress(data)
        except zstandard.ZstdError:
            # A frame written without its content size (by another tool) needs the streaming API.
            return zstandard.ZstdDecompressor().decompressobj().decompress(bytes(data))
    if family == "gz":
        return gzip.decompress(data)
    if family == "bz2":
        return bz2.decompress(data)
    if family == "br":
        import brotli

        return brotli.decompress(bytes(data))
    import snappy

    return snappy.decompress(bytes(data))


def _zstd_pieces(src: BinaryIO, chunk: int, limit: int) -> Iterator[bytes]:
    dctx = zstandard.ZstdDecompressor()
    with dctx.stream_reader(src, read_size=chunk, read_across_frames=True, closefd=False) as reader:
        while piece := reader.read(chunk):
            yield piece


def _gz_pieces(src: BinaryIO, chunk: int, limit: int) -> Iterator[bytes]:
    with gzip.GzipFile(fileobj=src, mode="rb") as reader:  # read(n) inflates with max_length=n
        while piece := reader.read(chunk):
            yield piece


def _bz2_pieces(src: BinaryIO, chunk: int, limit: int) -> Iterator[bytes]:
    with bz2.BZ2File(src, "rb") as reader:
        while piece := reader.read(chunk):
            yield piece


def _brotli_pieces(src: BinaryIO, chunk: int, limit: int) -> Iterator[bytes]:
    import brotli

    dec = brotli.Decompressor()
    while not dec.is_finished():
        data = src.read(chunk) if dec.can_accept_more_data() else b""
        piece = dec.process(data, output_buffer_limit=chunk)  # output grows past `chunk` at most once
        if piece:
            yield piece
        elif not data:
            raise ValueError("compressed stream ends before its end marker (truncated)")


def _snappy_pieces(src: BinaryIO, chunk: int, limit: int) -> Iterator[bytes]:
    import snappy

    data = src.read()
    declared = _varint(data)
    if declared > limit:
        raise InflateLimitError(limit, declared)
    out = snappy.decompress(data)
    for start in range(0, len(out), chunk):
        yield out[start:start + chunk]


def _varint(data: bytes) -> int:
    """The uncompressed length that starts a raw snappy block (a little-endian base-128 varint)."""
    value = 0
    for i, byte in enumerate(data[:10]):
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return value
    raise ValueError("not a snappy block: its length preamble is malformed")


_PIECES = {"zstd": _zstd_pieces, "gz": _gz_pieces, "bz2": _bz2_pieces,
           "br": _brotli_pieces, "snappy": _snappy_pieces}
