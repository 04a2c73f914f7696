"""Reading an index.json of half a million shards in one pass, without one Python object per shard.

MDS writers write index.json as `json.dumps(..., sort_keys=True)`: every entry of a dataset has the same
keys in the same order and differs from the others only in a few values, the sample count and each
file's basename, size and digests. So an entry's text is cut into a *template*: the literal text around
those values. The first entry of each template is parsed and validated by `ShardEntry.from_json`, as any
entry always was; every other entry is matched against a template with numpy over the raw bytes, a
block of entries at a time, and its values are checked in bulk against the same bounds (`MAX_SAMPLES`,
`MAX_BYTES`, `MAX_DIGEST`, a sample count that fits its file, `samples: 0` hiding samples, a file named
twice). A basename passes in bulk when it is plainly safe (letters, digits, `._-+=@,~` and '/' between
segments that are neither empty nor '.' or '..'), which `check_basename` always accepts unchanged; any
other goes through `check_basename` and `shard_key` themselves.

The text is read in chunks into one buffer, so memory stays a few MB whatever the index size. Anything
the walk does not expect (an escaped quote or backslash, a digest outside printable ASCII, more than `MAX_LAYOUTS`
templates, unusual text between entries, a value out of bounds, a duplicate) raises `Irregular`, and the
caller falls back to `DatasetIndex.from_json` of the whole text: that either raises the very error it
always raised, or accepts the index.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from tessera.shards.index import (
    _FILE_KEYS,
    MAX_BYTES,
    MAX_DIGEST,
    MAX_SAMPLES,
    MAX_TOTAL_SAMPLES,
    ShardEntry,
    check_basename,
    shard_key,
)

CHUNK = 4 << 20  # bytes read at a time
MAX_LAYOUTS = 64  # distinct entry templates; beyond, the index is parsed whole (Irregular)
_QUOTE, _OPEN_OBJ, _CLOSE_OBJ, _OPEN_ARR, _CLOSE_ARR = 5, 1, 2, 3, 4
_CODES = np.zeros(256, np.uint8)
_CODES[[ord("{"), ord("}"), ord("["), ord("]"), ord('"')]] = [_OPEN_OBJ, _CLOSE_OBJ, _OPEN_ARR, _CLOSE_ARR, _QUOTE]
_SAFE = np.zeros(256, bool)  # basename bytes the bulk check accepts
_SAFE[[ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+=@,~/"]] = True
_SHARDS_KEY = re.compile(rb'"shards"\s*:\s*$')
_SEPARATOR = re.compile(rb"\s*,\s*")
_TOKEN = re.compile(rb'\s*(?:"((?:[^"\\\x00-\x1f]|\\.)*)"|(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(true|false|null)|([{}\[\]:,]))')
_DIGITS = 20
_HASH_MULT = np.random.Generator(np.random.PCG64(24)).integers(1, 2**63, 256, dtype=np.uint64) | np.uint64(1)


class Irregular(Exception):
    """The index is not one the bulk reader handles (or is invalid): parse it whole instead."""


@dataclass(frozen=True)
class Template:
    """The text of one kind of entry: `literals[k]` comes before value k, `literals[-1]` ends the entry."""

    literals: tuple[bytes, ...]
    fields: tuple[str, ...]  # "samples", "raw_data.bytes", "raw_data.basename", "raw_data.hashes.sha1", ...
    entry: ShardEntry  # the validated entry the template was cut from

    @property
    def skeleton(self) -> bytes:
        return b"".join(self.literals)


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
        field = _var_field(tuple(level[1] for level in stack)) if all(level[0] for level in stack) else None
        if field is not None:
            if (string is not None) != is_text(field):
                raise Irregular(f"{field} of an unexpected type")
            start, end = match.span(1) if string is not None else match.span(2)
            literals.append(text[last:start])
            fields.append(field)
            last = end
    literals.append(text[last:])
    if sorted(fields) != sorted(value_fields(entry)):
        raise Irregular("entry values the bulk reader cannot place")
    return Template(tuple(literals), tuple(fields), entry)


def _digit_runs(a: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(end, value, bad) of the unsigned integer starting at each position (JSON: no leading zeros)."""
    d = a[np.minimum(pos[:, None] + np.arange(_DIGITS), a.size - 1)].astype(np.int64) - 48
    is_digit = (d >= 0) & (d <= 9)
    length = np.argmin(is_digit, axis=1)  # the first non-digit
    bad = is_digit.all(axis=1) | (length == 0) | (length > 18) | ((length > 1) & (d[:, 0] == 0))
    value = np.zeros(pos.size, np.int64)
    for k in range(int(min(length.max(initial=0), 18))):
        value = np.where(k < length, value * 10 + d[:, k], value)
    return pos + length, value, bad


@dataclass
class Block:
    """Values of a block of consecutive entries, in entry order, for the packer."""

    layout: np.ndarray  # int32: index into the scan's templates
    numbers: dict[str, np.ndarray]  # field -> int64 (-1 where the entry's template has no such field)
    strings: dict[str, tuple[np.ndarray, np.ndarray]]  # field -> (bytes, int64 lengths; 0 where absent)


class EntryMatcher:
    """Matches blocks of entry texts against the templates seen so far (cutting new ones as needed)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.templates: list[Template] = []
        self.shards = 0  # entries matched so far (the index of the next block's first entry)

    def block(self, a: np.ndarray, quotes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Block:
        """Entries a[starts[i] : ends[i] + 1] of this block (positions inside `a`, as are its `quotes`)."""
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
            ok, found, values = self._match(self.templates[t], a, quotes, starts[left], ends[left])
            if made and not ok[0]:
                raise Irregular("a template does not match its own entry")
            hit = left[ok]
            layout[hit] = t
            for field, (lo, hi) in found.items():
                if is_text(field):
                    full = spans.setdefault(field, (np.zeros(n, np.int64), np.zeros(n, np.int64)))
                    full[0][hit], full[1][hit] = lo[ok], hi[ok]
            for field, value in values.items():
                numbers.setdefault(field, np.full(n, -1, np.int64))[hit] = value[ok]
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

    def _match(self, t: Template, a: np.ndarray, quotes: np.ndarray, starts: np.ndarray, ends: np.ndarray
               ) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
        bad = np.zeros(starts.size, bool)
        pos = starts + len(t.literals[0])
        found, values = {}, {}
        for field, literal in zip(t.fields, t.literals[1:], strict=True):
            pos = np.minimum(pos, a.size - 1)
            if is_text(field):
                j = np.searchsorted(quotes, pos)
                bad |= j >= quotes.size
                end = quotes[np.minimum(j, quotes.size - 1)]
            else:
                end, values[field], wrong = _digit_runs(a, pos)
                bad |= wrong
            found[field] = (pos, end)
            pos = end + len(literal)
        bad |= pos != ends + 1
        ok = ~bad
        if ok.any():
            ok[ok] = _same_text(t, a, starts[ok], ends[ok], [(lo[ok], hi[ok]) for lo, hi in found.values()])
        return ok, found, values


def _same_text(t: Template, a: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               spans: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Whether each entry's text outside its values is the template's, byte for byte (one compare of the
    block's literal bytes when all match)."""
    n = starts.size
    bounds = np.empty((n, 2 * len(spans) + 2), np.int64)  # entry start, value edges, entry end
    bounds[:, 0], bounds[:, -1] = starts, ends + 1
    for k, (lo, hi) in enumerate(spans):
        bounds[:, 2 * k + 1], bounds[:, 2 * k + 2] = lo, hi
    gaps = np.zeros((n, 1), np.int64)  # the bytes between one matched entry and the next
    gaps[1:, 0] = starts[1:] - ends[:-1] - 1
    runs = np.concatenate([gaps, np.diff(bounds, axis=1)], axis=1)  # gap, literal, value, ..., literal
    pattern = np.zeros(runs.shape, bool)
    pattern[:, 1::2] = True
    kept = a[int(starts[0]):int(ends[-1]) + 1][np.repeat(pattern.reshape(-1), runs.reshape(-1))]
    skeleton = t.skeleton
    if kept.size != n * len(skeleton):  # cannot happen: the walk fixed each literal's length
        raise Irregular("entry text lengths disagree")
    if kept.tobytes() == skeleton * n:
        return np.ones(n, bool)
    return (kept.reshape(n, -1) == np.frombuffer(skeleton, np.uint8)).all(axis=1)


def _gather(a: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of spans [lo, hi) one after another, and their lengths."""
    lengths = hi - lo
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.uint8), lengths
    first = np.cumsum(lengths) - lengths
    return a[np.arange(total, dtype=np.int64) + np.repeat(lo - first, lengths)], lengths


def name_hashes(blob: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each name (`lengths` split `blob`): equal names hash equal; two different names
    collide with negligible chance, and a collision only sends the index to the whole-text parse."""
    out = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    nonempty = lengths > 0
    if not blob.size:
        return out
    first = np.cumsum(lengths) - lengths
    k = np.arange(blob.size, dtype=np.int64) - np.repeat(first, lengths)
    with np.errstate(over="ignore"):
        v = (blob.astype(np.uint64) + np.uint64(1)) * _HASH_MULT[k & 255] + k.astype(np.uint64) * _HASH_MULT[7]
        out[nonempty] += np.add.reduceat(v, first[nonempty])
    return out


def safe_names(blob: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per name, whether the bulk rule accepts it (then `check_basename` accepts it and `shard_key` leaves
    it unchanged); names it does not accept must go through those functions."""
    ok = lengths > 0
    if not blob.size:
        return ok
    first = np.cumsum(lengths) - lengths
    k = np.arange(blob.size, dtype=np.int64) - np.repeat(first, lengths)
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


def check_values(block: Block, templates: list[Template], first_shard: int,
                 label: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Bounds of a block's values (Irregular if any is out); the (name hash, shard) pairs of its files."""
    samples = block.numbers["samples"]
    if samples.max(initial=0) > MAX_SAMPLES:
        raise Irregular("samples out of bounds")
    for field, values in block.numbers.items():
        if field.endswith(".bytes") and values.max(initial=0) > MAX_BYTES:
            raise Irregular("bytes out of bounds")
    for field, (blob, lengths) in block.strings.items():
        if ".hashes." in field and (lengths.max(initial=0) > MAX_DIGEST or (blob.size and (
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
    out = []
    for field, (blob, lengths) in block.strings.items():
        if field.endswith(".basename"):
            present = lengths > 0
            if (np.array([field in t.fields for t in templates])[block.layout] & ~present).any():
                raise Irregular("an empty basename")
            out.append((checked_names(blob, lengths, shards, label)[present], shards[present]))
    return out


def check_unique(pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """No file is named by two shards (Irregular if one is: the whole-text parse names it)."""
    if not pairs:
        return
    hashes = np.concatenate([h for h, _ in pairs])
    shards = np.concatenate([s for _, s in pairs])
    order = np.lexsort((shards, hashes))
    hashes, shards = hashes[order], shards[order]
    if ((hashes[1:] == hashes[:-1]) & (shards[1:] != shards[:-1])).any():
        raise Irregular("a file named by two shards")


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
        if b"\\" in chunk and (b'\\"' in context[-1:] + chunk or b"\\\\" in context[-1:] + chunk):
            raise Irregular("an escaped quote or backslash in index.json")  # others (\n, \u00e9) hold no quote
        a = np.frombuffer(chunk, np.uint8)
        quotes = np.flatnonzero(a == 34)
        self.quotes = base + quotes
        at = np.flatnonzero((a & 0xD9) == 0x59)  # '{', '}', '[', ']' (and 'Y', '_', 'y', DEL: dropped next)
        kind = _CODES[a[at]]
        at, kind = at[kind > 0], kind[kind > 0]
        outside = ((np.searchsorted(quotes, at) + self.in_string) & 1) == 0  # an even count of quotes before
        self.in_string ^= bool(quotes.size & 1)
        at, kind = at[outside], kind[outside]
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
    scanner, matcher = ArrayScan(), EntryMatcher(label)
    buf, base = b"", 0  # buf holds the text from absolute position `base` on
    last_end = -1  # absolute position of the last entry's '}' (-1: none yet)
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    total, tail_checked = 0, False
    quotes = np.zeros(0, np.int64)  # absolute positions of the quotes in buf
    while chunk := file.read(CHUNK):
        hasher.update(chunk)
        scanner.feed(chunk, base + len(buf), buf[-256:])
        buf += chunk
        quotes = np.concatenate([quotes, scanner.quotes])
        starts, ends = scanner.take()
        if starts.size:
            _check_gaps(buf, base, scanner.open_at if last_end < 0 else last_end, starts, ends, last_end < 0)
            first = matcher.shards
            block = matcher.block(np.frombuffer(buf, np.uint8), quotes - base, starts - base, ends - base)
            pairs += check_values(block, matcher.templates, first, label)
            total += int(block.numbers["samples"].sum())
            emit(block, matcher.templates)
            last_end = int(ends[-1])
        if scanner.state == "after" and not tail_checked:
            if _between(buf, base, scanner.open_at if last_end < 0 else last_end, scanner.close_at).strip():
                raise Irregular("text after the last entry")
            tail_checked = True
        keep_from = len(buf) - 256 if scanner.state != "inside" else last_end + 1 - base
        if keep_from > 0:
            buf, base = buf[keep_from:], base + keep_from
            quotes = quotes[quotes >= base]
    if scanner.state != "after":
        raise Irregular('no "shards" array')
    check_unique(pairs)
    try:
        top = json.loads(bytes(scanner.prefix) + bytes(scanner.suffix))
    except (ValueError, RecursionError):
        raise Irregular("the top level is not valid JSON") from None
    if not isinstance(top, dict) or top.get("shards") != [] or top.get("version") != 2 or total > MAX_TOTAL_SAMPLES:
        raise Irregular("unexpected top level")
    return top


def _between(buf: bytes, base: int, lo: int, hi: int) -> bytes:
    """buf's text strictly between absolute positions lo and hi."""
    return buf[max(0, lo + 1 - base):max(0, hi - base)]


def _check_gaps(buf: bytes, base: int, gap_from: int, starts: np.ndarray, ends: np.ndarray, first: bool) -> None:
    """The text between entries is a comma between whitespace (before the array's first entry: whitespace)."""
    prev = np.concatenate([[gap_from], ends[:-1]])
    lead = _between(buf, base, int(prev[0]), int(starts[0]))
    if lead.strip() if first else not _SEPARATOR.fullmatch(lead):
        raise Irregular("text between entries")
    prev, starts = prev[1:], starts[1:]
    if not starts.size:
        return
    usual = _between(buf, base, int(prev[0]), int(starts[0]))
    if not _SEPARATOR.fullmatch(usual):
        raise Irregular("text between entries")
    same = starts - prev - 1 == len(usual)
    if same.any():
        got = np.frombuffer(buf, np.uint8)[(prev[same] + 1 - base)[:, None] + np.arange(len(usual))]
        same[same] = (got == np.frombuffer(usual, np.uint8)).all(axis=1)
    for i in np.flatnonzero(~same).tolist():
        if not _SEPARATOR.fullmatch(_between(buf, base, int(prev[i]), int(starts[i]))):
            raise Irregular("text between entries")
