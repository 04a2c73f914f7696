"""Entry templates of index.json, and blocks of entries matched against them with numpy (index_bulk.py).

MDS writers write index.json as `json.dumps(..., sort_keys=True)`: every entry of a dataset has the same
keys in the same order and differs from the others only in a few values, the sample count and each
file's basename, size and digests. So an entry's text is cut into a *template*: the literal text around
those values. The first entry of each template is parsed and validated by `ShardEntry.from_json`, as any
entry always was; every other entry is matched against the templates a block at a time.

The match is anchored on quotes. index_bulk.py refuses escaped quotes, so every '"' of the file delimits a
string and an entry of a template holds exactly the quotes of its literals (a text value sits between
two of them, a number holds none). Knowing the index of an entry's first quote, every literal's place
follows from one lookup in the block's quote positions: literal k starts at its first quote's position
minus that quote's offset in the literal (the closing literal of an entry that ends in a number, which
has no quote, ends where the entry ends). An entry matches when it holds as many quotes as the template,
its literals lie end to end in order from its '{' to its '}', each literal's bytes are the template's
(one compare of a window per literal for the whole block) and each number is 1 to 18 plain digits.
Then its text is the template's with the values put in, and the values are the spans between literals.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tessera.shards.index import _FILE_KEYS, ShardEntry

MAX_LAYOUTS = 64  # distinct entry templates; beyond, the index is parsed whole (Irregular)
_TOKEN = re.compile(rb'\s*(?:"((?:[^"\\\x00-\x1f]|\\.)*)"|(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(true|false|null)|([{}\[\]:,]))')
_DIGITS = 18  # the most digits of a number taken in bulk (int64 holds them all)


class Irregular(Exception):
    """The index is not one the bulk reader handles (or is invalid): parse it whole instead."""


@dataclass(frozen=True)
class Template:
    """The text of one kind of entry: `literals[k]` comes before value k, `literals[-1]` ends the entry."""

    literals: tuple[bytes, ...]
    fields: tuple[str, ...]  # "samples", "raw_data.bytes", "raw_data.basename", "raw_data.hashes.sha1", ...
    entry: ShardEntry  # the validated entry the template was cut from
    quotes: int = field(init=False)  # quotes in the entry's text (all in its literals)
    anchors: tuple[tuple[int, int] | None, ...] = field(init=False)  # per literal: (its first quote's
    # index among the entry's quotes, that quote's offset in the literal), None for a literal without one
    codes: tuple[np.ndarray, ...] = field(init=False, repr=False)  # the literals as uint8 arrays

    def __post_init__(self) -> None:
        anchors, seen = [], 0
        for literal in self.literals:
            at = literal.find(b'"')
            anchors.append(None if at < 0 else (seen, at))
            seen += literal.count(b'"')
        object.__setattr__(self, "quotes", seen)
        object.__setattr__(self, "anchors", tuple(anchors))
        object.__setattr__(self, "codes", tuple(np.frombuffer(lit, np.uint8) for lit in self.literals))


def value_fields(entry: ShardEntry) -> list[str]:
    """The names of an entry's per-shard values: what differs between entries of one layout."""
    fields = ["samples"]
    for key in _FILE_KEYS:
        info = getattr(entry, key)
        if info is not None:
            fields += [f"{key}.basename", f"{key}.bytes", *(f"{key}.hashes.{a}" for a in info.hashes)]
    return fields


def is_text(field: str) -> bool:
    """Whether a value field is a string (a basename or a digest), not a count."""
    return field.endswith(".basename") or ".hashes." in field


def _var_field(path: tuple[str, ...]) -> str | None:
    if path == ("samples",):
        return "samples"
    if len(path) == 2 and path[0] in _FILE_KEYS and path[1] in ("basename", "bytes"):
        return f"{path[0]}.{path[1]}"
    if len(path) == 3 and path[0] in _FILE_KEYS and path[1] == "hashes":
        return f"{path[0]}.hashes.{path[2]}"
    return None


def cut_template(text: bytes, entry: ShardEntry) -> Template:
    """The template of one entry's text (already validated as `entry`); Irregular if its text holds
    something the walk cannot follow (an escape, a key given twice)."""
    literals, fields, at, last = [], [], 0, 0
    stack: list[list[Any]] = []  # per open container: [is object, current key, keys seen, expecting a key]
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise Irregular("entry text the bulk reader cannot follow")
        string, _, _, punct = match.groups()
        top = stack[-1] if stack else None
        at = match.end()
        if punct is not None:
            if punct in (b"{", b"["):
                stack.append([punct == b"{", None, set(), punct == b"{"])
            elif punct in (b"}", b"]"):
                stack.pop()
            elif punct == b"," and top is not None and top[0]:
                top[3] = True
            continue
        if top is not None and top[0] and top[3] and string is not None:  # a key
            key = string.decode()
            if key in top[2]:
                raise Irregular(f"key {key!r} given twice in one object")
            top[1], top[3] = key, False
            top[2].add(key)
            continue
        field_name = _var_field(tuple(level[1] for level in stack)) if all(level[0] for level in stack) else None
        if field_name is not None:
            if (string is not None) != is_text(field_name):
                raise Irregular(f"{field_name} of an unexpected type")
            start, end = match.span(1) if string is not None else match.span(2)
            literals.append(text[last:start])
            fields.append(field_name)
            last = end
    literals.append(text[last:])
    if sorted(fields) != sorted(value_fields(entry)) or not all(literals):
        raise Irregular("entry values the bulk reader cannot place")
    return Template(tuple(literals), tuple(fields), entry)


@dataclass
class Block:
    """Values of a block of consecutive entries, in entry order, for the packer."""

    layout: np.ndarray  # int32: index into the scan's templates
    numbers: dict[str, np.ndarray]  # field -> int64 (-1 where the entry's template has no such field)
    strings: dict[str, tuple[np.ndarray, np.ndarray]]  # field -> (bytes, int64 lengths; 0 where absent)


def _digits(a: np.ndarray, lo: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, bad) of the unsigned integer a[lo : lo + length] (1 to 18 bytes; JSON: no leading zero)."""
    value = np.zeros(lo.size, np.int64)
    bad = (length > 1) & (a[lo] == ord("0"))
    for k in range(int(length.max(initial=0))):
        inside = k < length
        d = a[np.minimum(lo + k, a.size - 1)].astype(np.int64) - ord("0")
        bad |= inside & ((d < 0) | (d > 9))
        value = np.where(inside, value * 10 + d, value)
    return value, bad


def _windows_equal(a: np.ndarray, at: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Whether a[at[i] : at[i] + len(code)] == code, for each i (`at` kept inside `a`)."""
    width = code.size
    if a.size < width:
        return np.zeros(at.size, bool)
    same = sliding_window_view(a, width)[np.minimum(np.maximum(at, 0), a.size - width)] == code
    return np.ones(at.size, bool) if same.all() else same.all(axis=1)


def _gather(a: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of spans [lo, hi) one after another, and their lengths."""
    lengths = hi - lo
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.uint8), lengths
    width = int(lengths[0])
    if (lengths == width).all():  # names and digests of one width: one copy of windows
        return sliding_window_view(a, width)[lo].reshape(-1), lengths
    first = np.cumsum(lengths) - lengths
    return a[np.arange(total, dtype=np.int64) + np.repeat(lo - first, lengths)], lengths


class EntryMatcher:
    """Matches blocks of entry texts against the templates seen so far (cutting new ones as needed)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.templates: list[Template] = []
        self.shards = 0  # entries matched so far (the index of the next block's first entry)

    def block(self, a: np.ndarray, quotes: np.ndarray, starts: np.ndarray, ends: np.ndarray, first: np.ndarray,
              count: np.ndarray) -> Block:
        """Entries a[starts[i] : ends[i] + 1] of this block (positions inside `a`, as are its `quotes`,
        the positions of every '"' from the first entry's on): entry i holds the `count[i]` quotes from
        `quotes[first[i]]` on."""
        n = starts.size
        layout = np.full(n, -1, np.int32)
        spans: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        numbers: dict[str, np.ndarray] = {}
        left = np.arange(n)
        t = 0
        while left.size:
            made = t == len(self.templates)
            if made:
                self._new_template(a, int(starts[left[0]]), int(ends[left[0]]), self.shards + int(left[0]))
            ok, found, values = self._match(self.templates[t], a, quotes, first[left], count[left],
                                            starts[left], ends[left])
            if made and not ok[0]:
                raise Irregular("a template does not match its own entry")
            hit = left[ok]
            layout[hit] = t
            for name, (lo, hi) in found.items():
                full = spans.setdefault(name, (np.zeros(n, np.int64), np.zeros(n, np.int64)))
                full[0][hit], full[1][hit] = lo[ok], hi[ok]
            for name, value in values.items():
                numbers.setdefault(name, np.full(n, -1, np.int64))[hit] = value[ok]
            left = left[~ok]
            t += 1
        self.shards += n
        return Block(layout, numbers, {f: _gather(a, lo, hi) for f, (lo, hi) in spans.items()})

    def _new_template(self, a: np.ndarray, start: int, end: int, shard: int) -> None:
        if len(self.templates) >= MAX_LAYOUTS:
            raise Irregular(f"more than {MAX_LAYOUTS} kinds of entries")
        text = a[start:end + 1].tobytes()
        try:
            entry = ShardEntry.from_json(json.loads(text), self.label, shard)
        except Exception as err:  # noqa: BLE001 - the whole-text parse reports it, in index order
            raise Irregular(str(err)) from None
        self.templates.append(cut_template(text, entry))

    @staticmethod
    def _match(t: Template, a: np.ndarray, quotes: np.ndarray, first: np.ndarray, count: np.ndarray,
               starts: np.ndarray, ends: np.ndarray
               ) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
        """(matches, text spans, numbers) of entries against template `t` (spans and numbers of all the
        entries given; only those of matches mean anything)."""
        ok = count == t.quotes
        first = np.where(ok, first, 0)  # (quote indices stay inside `quotes` for the others too)
        if quotes.size < t.quotes:
            return np.zeros(starts.size, bool), {}, {}
        first = np.minimum(first, quotes.size - t.quotes)
        at = [ends + 1 - len(lit) if anchor is None else quotes[first + anchor[0]] - anchor[1]
              for lit, anchor in zip(t.literals, t.anchors, strict=True)]
        ok &= (at[0] == starts) & (at[-1] + len(t.literals[-1]) == ends + 1)
        spans, lengths = [], []
        for k in range(len(t.fields)):
            lo = at[k] + len(t.literals[k])
            spans.append((lo, at[k + 1]))
            lengths.append(at[k + 1] - lo)
            ok &= (lengths[-1] >= 0) if is_text(t.fields[k]) else (lengths[-1] >= 1) & (lengths[-1] <= _DIGITS)
        for pos, code in zip(at, t.codes, strict=True):
            sel = np.flatnonzero(ok)
            ok[sel] = _windows_equal(a, pos[sel], code)
        found, values = {}, {}
        for name, (lo, hi), length in zip(t.fields, spans, lengths, strict=True):
            if is_text(name):
                found[name] = (lo, hi)
                continue
            value, bad = _digits(a, np.where(ok, lo, 0), np.where(ok, length, 1))
            ok &= ~bad
            values[name] = value
        return ok, found, values
