"""Reading an index.json of half a million shards in one pass, without one Python object per shard.

The text is read in chunks (memory stays a few MB whatever the index size). Each chunk is scanned once
with numpy for its structural bytes: one translation of the bytes finds every quote and bracket, the quotes
before each bracket (their count) tell which brackets lie outside strings, and a running depth finds the
entries of the top-level "shards" array. Blocks of complete entries are matched against their templates
(index_template.py) and their values checked in bulk (index_values.py).

Anything the walk does not expect (an escaped quote or backslash, a digest outside printable ASCII, more
than `MAX_LAYOUTS` templates, unusual text between entries, a value out of bounds, a duplicate) raises
`Irregular`, and the caller falls back to `DatasetIndex.from_json` of the whole text: that either raises
the very error it always raised, or accepts the index.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tessera.shards.index import MAX_TOTAL_SAMPLES
from tessera.shards.index_template import Block, EntryMatcher, Irregular, Template
from tessera.shards.index_values import NameClaims, check_values

CHUNK = 1 << 20  # bytes read at a time (more costs memory, not less time)
_QUOTE, _OPEN_ARR, _CLOSE_ARR, _OPEN_OBJ, _CLOSE_OBJ = 0x22, 0x5B, 0x5D, 0x7B, 0x7D
_STRUCTURAL = bytes(int(byte in b'"[]{}') for byte in range(256))  # bytes.translate table: 1 for those
_SHARDS_KEY = re.compile(rb'"shards"\s*:\s*$')
_SEPARATOR = re.compile(rb"\s*,\s*")


class ArrayScan:
    """Finds the entries of the top-level "shards" array in chunks of text (brackets outside strings),
    keeping the text before and after the array for the top-level JSON."""

    def __init__(self) -> None:
        self.in_string = False
        self.depth = 0
        self.state = "before"  # then "inside", then "after"
        self.prefix = bytearray()  # text up to and including the array's '['
        self.suffix = bytearray()  # text from the array's ']' on
        self.open_at = self.close_at = -1  # absolute positions of the array's '[' and ']'
        self.starts: list[np.ndarray] = []
        self.ends: list[np.ndarray] = []
        self.quotes = np.zeros(0, np.int64)  # absolute positions of the quotes of the last chunk fed

    def feed(self, chunk: bytes, base: int, context: bytes) -> None:
        """Scan `chunk` (at absolute position `base`); `context` is the text just before it."""
        at = np.flatnonzero(np.frombuffer(chunk.translate(_STRUCTURAL), np.bool_))  # quotes and brackets
        kind = np.frombuffer(chunk, np.uint8)[at]
        is_quote = kind == _QUOTE
        self.quotes = base + at[is_quote]
        brackets = np.flatnonzero(~is_quote)
        before = brackets - np.arange(brackets.size)  # the quotes of the chunk before each bracket
        brackets = brackets[((before + self.in_string) & 1) == 0]  # outside strings: an even count before
        self.in_string ^= bool(self.quotes.size & 1)
        at, kind = at[brackets], kind[brackets]
        after = self.depth + np.cumsum(np.where((kind == _OPEN_OBJ) | (kind == _OPEN_ARR), 1, -1))
        if after.size:
            self.depth = int(after[-1])
        lo = 0
        if self.state == "before":
            for j in np.flatnonzero((kind == _OPEN_ARR) & (after == 2)).tolist():
                pos = int(at[j])
                if _SHARDS_KEY.search((context + chunk[max(0, pos - 256):pos])[-256:]):
                    self.prefix += chunk[:pos + 1]
                    self.state, self.open_at, lo = "inside", base + pos, j + 1
                    break
            else:
                self.prefix += chunk
                return
        if self.state == "inside":
            k, depth = kind[lo:], after[lo:]
            close = np.flatnonzero((k == _CLOSE_ARR) & (depth == 1))
            hi = int(close[0]) if close.size else k.size
            k, depth, where = k[:hi], depth[:hi], at[lo:lo + hi]
            if ((k == _OPEN_ARR) & (depth == 3)).any():
                raise Irregular("a shard entry that is not an object")
            self.starts.append(base + where[(k == _OPEN_OBJ) & (depth == 3)])
            self.ends.append(base + where[(k == _CLOSE_OBJ) & (depth == 2)])
            if close.size:
                pos = int(at[lo + hi])
                self.state, self.close_at = "after", base + pos
                self.suffix += chunk[pos:]
            return
        self.suffix += chunk

    def resume(self) -> None:
        """Go on from a place inside the array between two entries (outside strings)."""
        self.state, self.depth, self.in_string = "inside", 2, False
        self.starts, self.ends = [], []

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) positions of the entries completed since the last call; an entry whose end is
        not seen yet stays for the next call."""
        starts = np.concatenate(self.starts) if self.starts else np.zeros(0, np.int64)
        ends = np.concatenate(self.ends) if self.ends else np.zeros(0, np.int64)
        self.starts, self.ends = [starts[ends.size:]], []
        return starts[:ends.size], ends


def scan(file: BinaryIO, label: str, emit: Callable[[Block, list[Template]], None],
         hasher: Any) -> dict[str, Any]:
    """Read index.json from `file` in chunks, `emit` each block of entries (with the templates so far)
    and feed every byte to `hasher` (an xxhash object); return the top-level object (its "shards" []).
    Irregular when the text is not what the bulk reader takes."""
    walk = _Walk(label, emit)
    while chunk := file.read(CHUNK):
        hasher.update(chunk)
        walk.feed(chunk)
    return walk.finish()


class _Walk:
    """One pass over the text. The brackets find the "shards" array and its first entries; from then on
    entries are found by their quotes alone while they follow each other as MDS writers write them
    (`_by_quotes`), and by the brackets again from the first place where they do not."""

    def __init__(self, label: str, emit: Callable[[Block, list[Template]], None]) -> None:
        self.label, self.emit = label, emit
        self.scanner = ArrayScan()
        self.by_quotes: bool | None = None  # None: not tried yet; False: the brackets to the end
        self.matcher, self.claims, self.total = EntryMatcher(label), NameClaims(), 0
        self.buf, self.base = b"", 0  # buf holds the text from absolute position `base` on
        self.last_end = -1  # absolute position of the last entry's '}' (-1: none yet)
        self.quotes = np.zeros(0, np.int64)  # by brackets: absolute positions of the quotes in buf

    def feed(self, chunk: bytes) -> None:
        tail = self.buf[-1:] + chunk[:1]
        if (b"\\" in chunk or b"\\" in tail) and (b'\\"' in tail or b"\\\\" in tail or b'\\"' in chunk or b"\\\\" in chunk):
            raise Irregular("an escaped quote or backslash in index.json")  # others (\n, \u00e9) hold no quote
        self.buf += chunk
        if not (self.by_quotes and self._by_quotes()):
            if self.by_quotes:  # entries that do not follow each other as expected: by brackets from here
                self.by_quotes = False
                self._rescan()
            else:
                self.scanner.feed(chunk, self.base + len(self.buf) - len(chunk), self.buf[-len(chunk) - 256:-len(chunk)])
                self._by_brackets()
            if self.by_quotes is None and self.scanner.state == "inside" and self.last_end >= 0:
                self.by_quotes = True
        keep_from = len(self.buf) - 256 if self.scanner.state != "inside" else self.last_end + 1 - self.base
        if keep_from > 0:
            self.buf, self.base = self.buf[keep_from:], self.base + keep_from
            self.quotes = self.quotes[self.quotes >= self.base]

    def finish(self) -> dict[str, Any]:
        if self.by_quotes and self.scanner.state == "inside":  # the last entry and the array's end
            self.by_quotes = False   # by brackets now: what they cannot match is Irregular (the exact errors)
            self._rescan()
        if self.scanner.state != "after":
            raise Irregular('no "shards" array')
        if self._between(self.scanner.open_at if self.last_end < 0 else self.last_end, self.scanner.close_at).strip():
            raise Irregular("text after the last entry")
        self.claims.check()
        try:
            top = json.loads(bytes(self.scanner.prefix) + bytes(self.scanner.suffix))
        except (ValueError, RecursionError):
            raise Irregular("the top level is not valid JSON") from None
        if (not isinstance(top, dict) or top.get("shards") != [] or top.get("version") != 2
                or self.total > MAX_TOTAL_SAMPLES):
            raise Irregular("unexpected top level")
        return top

    def _rescan(self) -> None:
        """Scan by brackets the text after the last entry (inside the array, outside strings)."""
        self.scanner.resume()
        at = self.last_end + 1 - self.base
        self.scanner.feed(self.buf[at:], self.last_end + 1, self.buf[:at])
        self.quotes = np.zeros(0, np.int64)
        self._by_brackets()

    def _by_brackets(self) -> None:
        self.quotes = np.concatenate([self.quotes, self.scanner.quotes])
        starts, ends = self.scanner.take()
        if not starts.size:
            return
        self._check_gaps(self.scanner.open_at if self.last_end < 0 else self.last_end, starts, ends)
        quotes = self.quotes - self.base
        first = np.searchsorted(quotes, starts - self.base)
        self._entries(quotes, starts - self.base, ends - self.base, first, np.searchsorted(quotes, ends - self.base) - first)

    def _by_quotes(self) -> bool:
        """The complete entries after the last one, found by their quotes: each '{"' whose '{' follows
        ',' or ', ' right after a '}'. False (and nothing changed) where the text is not that regular; an
        entry whose end is not seen yet waits for the next chunk."""
        at = self.last_end + 1 - self.base
        lead = self.buf[at:at + 3]
        if not (lead[:2] == b",{" or lead == b", {"):  # the array's end, or another layout of the text
            return lead in (b"", b",", b", ")  # (or the next entry's first bytes are not read yet)
        a = np.frombuffer(self.buf, np.uint8)[at:]
        quotes = np.flatnonzero(a == _QUOTE)
        opening = quotes[0::2]  # (the text starts outside strings, after an entry's '}': each >= 2)
        brace = np.flatnonzero(a[opening - 1] == _OPEN_OBJ)
        comma = a[opening[brace] - 2] == ord(",")
        spaced = ~comma & (a[opening[brace] - 2] == ord(" ")) & (a[np.maximum(opening[brace] - 3, 0)] == ord(","))
        brace = brace[comma | spaced]
        starts = opening[brace] - 1
        ends = starts - np.where(comma[comma | spaced], 2, 3)  # the previous entry's '}'
        if not starts.size:
            return a.size < 4  # (the first entry's opening quote is not read yet), or '{ "'...
        if ends[0] != -1 or (a[ends[1:]] != _CLOSE_OBJ).any():
            return False
        first = 2 * brace
        kept = len(self.matcher.templates)
        try:
            self._entries(quotes, starts[:-1], ends[1:], first[:-1], np.diff(first), a)
        except _NotMatched:
            del self.matcher.templates[kept:]
            return False
        return True

    def _entries(self, quotes: np.ndarray, starts: np.ndarray, ends: np.ndarray, first: np.ndarray,
                 count: np.ndarray, a: np.ndarray | None = None) -> None:
        """Match, check and emit entries (positions in `a`, by default buf as an array)."""
        if not starts.size:
            return
        a = np.frombuffer(self.buf, np.uint8) if a is None else a
        shard = self.matcher.shards
        try:
            block = self.matcher.block(a, quotes, starts, ends, first, count)
        except Irregular:
            if self.by_quotes:
                raise _NotMatched from None
            raise
        check_values(block, self.matcher.templates, shard, self.label, self.claims)
        self.total += int(block.numbers["samples"].sum())
        self.emit(block, self.matcher.templates)
        self.last_end = int(ends[-1]) + (len(self.buf) - a.size) + self.base

    def _between(self, lo: int, hi: int) -> bytes:
        """buf's text strictly between absolute positions lo and hi."""
        return self.buf[max(0, lo + 1 - self.base):max(0, hi - self.base)]

    def _check_gaps(self, gap_from: int, starts: np.ndarray, ends: np.ndarray) -> None:
        """The text between entries is a comma between whitespace (before the array's first entry:
        whitespace)."""
        prev = np.concatenate([[gap_from], ends[:-1]])
        lead = self._between(int(prev[0]), int(starts[0]))
        if lead.strip() if self.last_end < 0 else not _SEPARATOR.fullmatch(lead):
            raise Irregular("text between entries")
        prev, starts = prev[1:], starts[1:]
        if not starts.size:
            return
        usual = self._between(int(prev[0]), int(starts[0]))
        if not _SEPARATOR.fullmatch(usual):
            raise Irregular("text between entries")
        same = starts - prev - 1 == len(usual)
        if same.any():
            windows = sliding_window_view(np.frombuffer(self.buf, np.uint8), len(usual))
            same[same] = (windows[prev[same] + 1 - self.base] == np.frombuffer(usual, np.uint8)).all(axis=1)
        for i in np.flatnonzero(~same).tolist():
            if not _SEPARATOR.fullmatch(self._between(int(prev[i]), int(starts[i]))):
                raise Irregular("text between entries")


class _NotMatched(Exception):
    """Entries found by their quotes that do not match: found again by brackets (which raise Irregular
    if the text really is irregular)."""
