"""Shard digests: every `hashlib` algorithm except shake, and the xxhash family, as lowercase hex.

Digests are computed incrementally (`Digests.update`) so a writer can hash a shard's header, config and
sample body without first joining them into one buffer.
"""

from __future__ import annotations

from collections.abc import Iterable

from tessera.storage.transfer import HASH_ALGORITHMS, HASHLIB_ALGORITHMS, XXHASH_ALGORITHMS, new_hasher

__all__ = ["HASHLIB_ALGORITHMS", "HASH_ALGORITHMS", "XXHASH_ALGORITHMS", "Digests", "digest_parts", "hash_hex",
           "is_hash", "new_hasher", "normalize_hashes"]



def is_hash(algo: str) -> bool:
    """Whether `algo` names a supported hash algorithm."""
    return algo in HASH_ALGORITHMS


def normalize_hashes(algos: Iterable[str] | None) -> list[str]:
    """Validate, de-duplicate and sort hash names (index.json lists them sorted and unique)."""
    names = sorted(set(algos or ()))
    for algo in names:
        new_hasher(algo)
    return names


def hash_hex(algo: str, data: bytes | bytearray | memoryview) -> str:
    """The lowercase hex digest of `data`."""
    hasher = new_hasher(algo)
    hasher.update(data)
    return hasher.hexdigest()


class Digests:
    """Several digests of one byte stream, fed in pieces."""

    def __init__(self, algos: Iterable[str]) -> None:
        self._hashers = {algo: new_hasher(algo) for algo in algos}

    def update(self, data: bytes | bytearray | memoryview) -> None:
        for hasher in self._hashers.values():
            hasher.update(data)

    def hexdigests(self) -> dict[str, str]:
        return {algo: hasher.hexdigest() for algo, hasher in self._hashers.items()}


def digest_parts(algos: Iterable[str], parts: Iterable[bytes | bytearray | memoryview]) -> dict[str, str]:
    """Hex digests of the concatenation of `parts`."""
    digests = Digests(algos)
    for part in parts:
        digests.update(part)
    return digests.hexdigests()
