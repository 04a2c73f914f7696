"""index.json at the scale of half a million shards: split into entries, checked in chunks, summed.

`DatasetIndex.from_json` keeps a ShardEntry per shard: for 488,894 shards, 18 s and 1.5 GB. The tools
that need only the index's verdict and totals (`tessera data inspect`, `tessera data verify`) scan it
instead, and keep no per-shard object:
- `split_index` finds where each shard entry's JSON lies in the text (one `raw_decode` per entry, each
  freed at once) and reads the top-level keys. Anything unusual at the top level (JSON that does not
  parse, not an object, "shards" not a list, another version) is handed to `DatasetIndex.from_json`,
  so the error is the one every reader gives;
- `check_entries` validates a chunk of entries with `ShardEntry.from_json` (the checks of every reader)
  and returns compact facts: counts and sums, the first invalid entry, and a 64-bit digest of each
  file's key, from which files listed twice are found across chunks;
- `scan_index` runs the chunks (in worker processes for a large index, pool.py), in order, and stops at
  the first chunk holding an invalid entry or a file listed twice within it. It decides the verdict in
  the order `from_json` would: the first invalid entry or the first file listed again, whichever comes
  first; then the samples' total; then the entries that hide samples (listed, not fatal: `hidden`).
"""

from __future__ import annotations

import json
import re
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from tessera.shards.index import (
    DatasetIndex,
    InconsistentIndex,
    IndexFormatError,
    ShardEntry,
    check_total_samples,
    hidden_samples,
    listed_again,
    shard_key,
)
from tessera.shards.pool import AHEAD_PER_WORKER, SCAN_MIN_ENTRIES, auto_workers, ordered_map, worker_pool

CHUNK = 2048  # entries a worker validates per task
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclass
class IndexText:
    """index.json's text with each shard entry's place in it: entry i is text[starts[i]:ends[i]]."""

    label: str
    text: str
    starts: np.ndarray
    ends: np.ndarray
    extensions: dict[str, Any]

    def __len__(self) -> int:
        return len(self.starts)

    def chunk(self, lo: int, hi: int) -> str:
        """Entries lo..hi-1 as the text of a JSON array's items (their separators included)."""
        return self.text[int(self.starts[lo]):int(self.ends[hi - 1])] if hi > lo else ""

    def chunks(self, size: int) -> Iterator[tuple[int, str]]:
        for lo in range(0, len(self), size):
            yield lo, self.chunk(lo, min(len(self), lo + size))

    def entry(self, shard: int) -> ShardEntry:
        return ShardEntry.from_json(json.loads(self.chunk(shard, shard + 1)), self.label, shard)


def _skip(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]  # matches the empty string too


def _items(text: str, pos: int, starts: array, ends: array) -> int:
    """Record where each item of the JSON array opening at `pos` lies; the position after it."""
    pos = _skip(text, pos + 1)
    if text.startswith("]", pos):
        return pos + 1
    while True:
        starts.append(pos)
        _, pos = _DECODER.raw_decode(text, pos)
        ends.append(pos)
        pos = _skip(text, pos)
        if text.startswith("]", pos):
            return pos + 1
        if not text.startswith(",", pos):
            raise ValueError("expected ','")
        pos = _skip(text, pos + 1)


def _split(text: str) -> tuple[array, array, dict[str, Any]] | None:
    """(starts, ends, other top-level keys) of an object holding a "shards" list; None if it is not one."""
    starts, ends, top, seen = array("q"), array("q"), {}, False
    pos = _skip(text, 0)
    if not text.startswith("{", pos):
        return None
    pos = _skip(text, pos + 1)
    while text.startswith('"', pos):
        key, pos = _DECODER.raw_decode(text, pos)
        pos = _skip(text, pos)
        if not text.startswith(":", pos):
            return None
        pos = _skip(text, pos + 1)
        if key == "shards":  # a repeated key: the last one counts, as for json.loads
            if not text.startswith("[", pos):
                return None
            starts, ends, seen = array("q"), array("q"), True
            pos = _items(text, pos, starts, ends)
        else:
            top[key], pos = _DECODER.raw_decode(text, pos)
        pos = _skip(text, pos)
        if text.startswith("}", pos):
            return (starts, ends, top) if seen and _skip(text, pos + 1) == len(text) else None
        if not text.startswith(",", pos):
            return None
        pos = _skip(text, pos + 1)
    return None


def split_index(data: bytes | str, label: str) -> IndexText:
    """Where each shard entry of index.json lies; IndexFormatError (as from_json's) if it is no index."""
    found = None
    try:
        text = data.decode(json.detect_encoding(data), "surrogatepass") if isinstance(data, bytes) else data
        if not text.startswith("\ufeff"):
            found = _split(text)
    except (ValueError, RecursionError):  # not JSON (JSONDecodeError, UnicodeDecodeError are ValueErrors)
        found = None
    if found is None or found[2].get("version") != 2:
        DatasetIndex.from_json(data, label)  # raises the error every reader gives
        raise IndexFormatError(label, "not an index this tool can split into shard entries")
    starts, ends, top = found
    top.pop("version")
    return IndexText(label, text, np.frombuffer(starts, np.int64), np.frombuffer(ends, np.int64), top)


@dataclass
class EntryFacts:
    """What a scan keeps of a run of shard entries (one chunk, or the whole index once merged)."""

    valid: int = 0  # entries checked before the first invalid one
    error: IndexFormatError | None = None  # the first invalid entry's
    samples: int = 0
    raw_bytes: int = 0
    stored_bytes: int = 0
    formats: Counter[str] = field(default_factory=Counter)
    compression: set[str] = field(default_factory=set)
    hashes: set[str] = field(default_factory=set)
    columns: dict[str, str] | None = None  # the first entry's, name -> encoding
    keys: list[np.ndarray] = field(default_factory=list)  # xxh64 of each file's store key
    owners: list[np.ndarray] = field(default_factory=list)  # the shard listing it
    hidden: list[InconsistentIndex] = field(default_factory=list)  # `samples: 0` hiding samples
    named: list[tuple[str, int]] | None = None  # (data file, samples) of each entry, when asked

    def add(self, other: EntryFacts) -> None:
        """Append the facts of the chunk that follows (nothing after an invalid entry counts)."""
        if self.error is not None:
            return
        self.valid += other.valid
        self.error = other.error
        self.samples += other.samples
        self.raw_bytes += other.raw_bytes
        self.stored_bytes += other.stored_bytes
        self.formats.update(other.formats)
        self.compression |= other.compression
        self.hashes |= other.hashes
        self.columns = self.columns if self.columns is not None else other.columns
        self.keys += other.keys
        self.owners += other.owners
        self.hidden += other.hidden
        if self.named is not None and other.named is not None:
            self.named += other.named


def check_entries(label: str, start: int, items: str, named: bool = False) -> EntryFacts:
    """Validate the entries in `items` (JSON array items, the first being shard `start`); their facts."""
    facts = EntryFacts(named=[] if named else None)
    keys, owners = array("Q"), array("q")
    owner: dict[str, int] = {}  # files listed twice within the chunk are found here, at once
    for shard, raw in enumerate(json.loads(f"[{items}]"), start):
        try:
            entry = ShardEntry.from_json(raw, label, shard)
            for info in entry.files:
                if (first := owner.setdefault(shard_key(info.basename), shard)) != shard:
                    raise listed_again(info.basename, first, shard, label)
        except IndexFormatError as exc:
            facts.error = exc
            break
        facts.valid += 1
        facts.samples += entry.samples
        facts.raw_bytes += entry.raw_data.bytes
        facts.stored_bytes += entry.stored.bytes
        facts.formats[entry.format] += 1
        facts.compression.add(entry.compression or "none")
        facts.hashes.update(entry.hashes)
        if facts.columns is None:
            facts.columns = dict(zip(entry.column_names, entry.column_encodings, strict=True))
        for info in entry.files:
            keys.append(xxhash.xxh64_intdigest(shard_key(info.basename).encode()))
            owners.append(shard)
        if (problem := hidden_samples(entry, shard, label)) is not None:
            facts.hidden.append(problem)
        if facts.named is not None:
            facts.named.append((entry.raw_data.basename, entry.samples))
    facts.keys, facts.owners = [np.frombuffer(keys, np.uint64)], [np.frombuffer(owners, np.int64)]
    return facts


@dataclass
class IndexScan:
    """The verdict and totals of a whole index.json, without a per-shard object (see the module doc)."""

    index: IndexText
    facts: EntryFacts
    error: IndexFormatError | None  # the index cannot be read (what every reader would refuse)

    @property
    def shards(self) -> int:
        return len(self.index)


def _listed_twice(index: IndexText, facts: EntryFacts) -> InconsistentIndex | None:
    """The first entry naming a file an earlier entry named, as `from_json` finds it. Only the entries
    before the first invalid one have their files in `facts`: from_json stops there too."""
    if not facts.keys:
        return None
    keys, owners = np.concatenate(facts.keys), np.concatenate(facts.owners)
    order = np.lexsort((owners, keys))
    keys, owners = keys[order], owners[order]
    again = np.nonzero((keys[1:] == keys[:-1]) & (owners[1:] != owners[:-1]))[0] + 1
    for shard in sorted({int(owners[i]) for i in again}):
        entry = index.entry(shard)
        for info in entry.files:  # a digest shared by chance is no duplicate: compare the names
            mine = xxhash.xxh64_intdigest(shard_key(info.basename).encode())
            lo, hi = np.searchsorted(keys, np.uint64(mine), "left"), np.searchsorted(keys, np.uint64(mine), "right")
            for first in sorted({int(o) for o in owners[lo:hi] if o < shard}):
                if any(shard_key(f.basename) == shard_key(info.basename) for f in index.entry(first).files):
                    return listed_again(info.basename, first, shard, index.label)
    return None


def scan_index(data: bytes | str, label: str, workers: int | None = 1, named: bool = False) -> IndexScan:
    """Split and check index.json, in `workers` processes (None: one per CPU for a large index); raises
    IndexFormatError only for what `split_index` refuses, and returns any other error in `IndexScan.error`.
    `named` keeps each entry's data file and samples (`EntryFacts.named`)."""
    index = split_index(data, label)
    facts = EntryFacts(named=[] if named else None)
    workers = auto_workers(workers, len(index), SCAN_MIN_ENTRIES)
    jobs = ((label, lo, items, named) for lo, items in index.chunks(CHUNK))
    with worker_pool(workers) as pool:
        for chunk in ordered_map(pool, check_entries, jobs, workers * AHEAD_PER_WORKER):
            facts.add(chunk)
            if facts.error is not None:
                break  # later entries do not change the verdict (ordered_map cancels the rest)
    error = _listed_twice(index, facts) or facts.error
    if error is None:
        try:
            check_total_samples(facts.samples, label)
        except IndexFormatError as exc:
            error = exc
    return IndexScan(index, facts, error)
