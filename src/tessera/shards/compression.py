"""Shard compression: the five MDS families and their level strings ("zstd", "zstd:7", "br:11", ...).

A compressed shard is one stream over the whole raw shard file. The exact bytes matter: for the same
input and settings our shards are byte-identical to MosaicML's, so each family uses the same library
call with the same parameters (zstd through `zstandard`, a single frame with the content size).
"""

from __future__ import annotations

import bz2
import gzip
from dataclasses import dataclass

import zstandard


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
        """Decompress one stream of this family."""
        return _decompress(self.family, data)


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
