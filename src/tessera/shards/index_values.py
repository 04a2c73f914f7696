"""The values of blocks of index.json entries checked in bulk, as `DatasetIndex.from_json` checks them one
by one (index_bulk.py): bounds (`MAX_SAMPLES`, `MAX_BYTES`, `MAX_DIGEST`), a sample count that fits its
file, `samples: 0` hiding samples, safe basenames, and no file named by two shards.

A basename passes in bulk when it is plainly safe (letters, digits, `._-+=@,~` and '/' between segments
that are neither empty nor '.' or '..'), which `check_basename` always accepts unchanged; any other goes
through `check_basename` and `shard_key` themselves. Anything out of bounds raises `Irregular`, and the
caller parses the whole text, which raises the very error the loader always raised.
"""

from __future__ import annotations

import numpy as np

from tessera.shards.index import MAX_BYTES, MAX_DIGEST, MAX_SAMPLES, check_basename, shard_key
from tessera.shards.index_template import Block, Irregular, Template

_SAFE = np.zeros(256, bool)  # basename bytes the bulk check accepts
_SAFE[[ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+=@,~/"]] = True
_HASH_MULT = np.random.Generator(np.random.PCG64(24)).integers(1, 2**63, 256, dtype=np.uint64) | np.uint64(1)
_LENGTH_MULT = np.uint64(0x9E3779B97F4A7C15)


def _positions(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first byte of each name in the blob, position of every blob byte inside its name)."""
    first = np.cumsum(lengths) - lengths
    return first, np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(first, lengths)


def _width(lengths: np.ndarray) -> int:
    """The one length of all the names (> 0), else 0."""
    width = int(lengths[0]) if lengths.size else 0
    return width if width and (lengths == width).all() else 0


def name_hashes(blob: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each name (`lengths` split `blob`): equal names hash equal; two different names
    collide with negligible chance, and a collision only sends the index to the whole-text parse."""
    out = lengths.astype(np.uint64) * _LENGTH_MULT
    if not blob.size:
        return out
    with np.errstate(over="ignore"):
        if width := _width(lengths):  # one row per name: a sum along rows
            k = np.arange(width, dtype=np.uint64)
            v = (blob.reshape(-1, width).astype(np.uint64) + np.uint64(1)) * _HASH_MULT[k % 256] + k * _HASH_MULT[7]
            return out + v.sum(axis=1, dtype=np.uint64)
        first, k = _positions(lengths)
        v = (blob.astype(np.uint64) + np.uint64(1)) * _HASH_MULT[k & 255] + k.astype(np.uint64) * _HASH_MULT[7]
        nonempty = lengths > 0
        out[nonempty] += np.add.reduceat(v, first[nonempty])
    return out


def safe_names(blob: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per name, whether the bulk rule accepts it (then `check_basename` accepts it and `shard_key` leaves
    it unchanged); names it does not accept must go through those functions."""
    ok = lengths > 0
    if not blob.size:
        return ok
    width = _width(lengths)
    if width >= 3 and not (blob == ord("/")).any():  # one segment, longer than '..': safe bytes suffice
        return _SAFE[blob.reshape(-1, width)].all(axis=1)
    first, k = _positions(lengths)
    end = np.repeat(lengths, lengths) - 1
    slash, dot = blob == ord("/"), blob == ord(".")
    prev_edge = np.ones(blob.size, bool)  # the byte before is a '/' or the name's start
    prev_edge[1:] = slash[:-1]
    prev_edge |= k == 0
    next_edge = np.ones(blob.size, bool)  # the byte after is a '/' or the name's end
    next_edge[:-1] = slash[1:]
    next_edge |= k == end
    next_dot = np.zeros(blob.size, bool)
    next_dot[:-1] = dot[1:]
    edge_after_next = np.ones(blob.size, bool)
    edge_after_next[:-2] = slash[2:]
    edge_after_next |= k + 1 >= end
    wrong = ~_SAFE[blob] | (slash & (prev_edge | (k == end))) | (dot & prev_edge & next_edge)
    wrong |= dot & prev_edge & next_dot & (k < end) & edge_after_next
    nonempty = lengths > 0
    ok[nonempty] &= np.add.reduceat(wrong.astype(np.int64), first[nonempty]) == 0
    return ok


def checked_names(blob: np.ndarray, lengths: np.ndarray, shards: np.ndarray, label: str) -> np.ndarray:
    """Hashes of one basename column's names after the path checks: the bulk rule, else `check_basename`
    (Irregular on refusal), hashing `shard_key` of such a name."""
    hashes = name_hashes(blob, lengths)
    odd = np.flatnonzero(~safe_names(blob, lengths) & (lengths > 0))
    first = np.cumsum(lengths) - lengths
    for i in odd.tolist():
        raw = blob[first[i]:first[i] + lengths[i]].tobytes()
        if min(raw) < 0x20:
            raise Irregular("a control character in a basename")
        try:
            key = shard_key(check_basename(raw.decode(), label, int(shards[i])))
        except Exception as err:  # noqa: BLE001 - reported by the whole-text parse, in order
            raise Irregular(str(err)) from None
        encoded = np.frombuffer(key.encode(), np.uint8)
        hashes[i] = name_hashes(encoded, np.array([encoded.size]))[0]
    return hashes


class NameClaims:
    """The files the shards name, kept as name hashes (8 bytes a name) to find one named by two shards."""

    def __init__(self) -> None:
        self.hashes: list[np.ndarray] = []

    def add(self, hashes: np.ndarray) -> None:
        """Hashes of names, no two of them from one shard (a shard may name one file twice)."""
        self.hashes.append(hashes)

    def check(self) -> None:
        """Irregular if two hashes are equal: a file named by two shards (or, with negligible chance, two
        names that collide), which the whole-text parse then names (or accepts)."""
        hashes = np.concatenate(self.hashes) if self.hashes else np.zeros(0, np.uint64)
        self.hashes = []
        hashes.sort()
        if (hashes[1:] == hashes[:-1]).any():
            raise Irregular("a file named by two shards")


def check_values(block: Block, templates: list[Template], first_shard: int, label: str, claims: NameClaims) -> None:
    """Bounds of a block's values (Irregular if any is out); the names of its files go to `claims`."""
    samples = block.numbers["samples"]
    if samples.max(initial=0) > MAX_SAMPLES:
        raise Irregular("samples out of bounds")
    for name, values in block.numbers.items():
        if name.endswith(".bytes") and values.max(initial=0) > MAX_BYTES:
            raise Irregular("bytes out of bounds")
    for name, (blob, lengths) in block.strings.items():
        if ".hashes." in name and (lengths.max(initial=0) > MAX_DIGEST or (blob.size and (
                blob.min() < 0x20 or blob.max() > 0x7E or (blob == 0x5C).any()))):
            raise Irregular("a digest the bulk reader does not take")
    for t, template in enumerate(templates):
        mine = block.layout == t
        if not mine.any():
            continue
        entry = template.entry
        header = "raw_data" if entry.format == "mds" else "raw_meta" if entry.raw_meta is not None else None
        if header is not None:
            size = block.numbers[f"{header}.bytes"][mine]
            if (samples[mine] > np.maximum(0, (size - 8) // 4)).any():
                raise Irregular("a sample count does not fit its file")
        if ((samples[mine] == 0) & (block.numbers["raw_data.bytes"][mine] > entry.empty_size())).any():
            raise Irregular("samples: 0 on a shard that holds samples")
    shards = first_shard + np.arange(block.layout.size, dtype=np.int64)
    seen: list[tuple[np.ndarray, np.ndarray]] = []  # (hashes, present) of the block's name columns so far
    for name, (blob, lengths) in block.strings.items():
        if name.endswith(".basename"):
            present = lengths > 0
            if (np.array([name in t.fields for t in templates])[block.layout] & ~present).any():
                raise Irregular("an empty basename")
            hashes = checked_names(blob, lengths, shards, label)
            fresh = present.copy()
            for other, there in seen:  # a name the same shard already gave in another column: once
                fresh &= ~(there & (other == hashes))
            seen.append((hashes, present))
            claims.add(hashes[fresh])
