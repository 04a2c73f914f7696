"""A growing file as a chain of immutable chunks in an object store, which has no append.

A chain is a key prefix holding `<seq>.chunk` objects, seq = 0, 1, 2, ... (twelve digits, so the keys
sort in seq order). Each chunk is one header line and a payload:

    {"resumption": 0, "from": 1200, "to": 1800}\\n<payload>

`from`/`to` are the byte range of the local file the payload was made from (the payload is those bytes
with secret values masked, so its length may differ). A chunk is written with a conditional create (S3's
If-None-Match, a hard link locally): a reader sees a whole chunk or none, and of two writers racing for
one seq exactly one wins; the loser learns the chain's true end and goes on from there. So the chain is
its own record of what was shipped: nothing is written twice and nothing is skipped, whichever process
ships, crashes or takes over, without an offset kept anywhere else.

A follower keeps the next seq it wants and lists with StartAfter: one LIST returns only new chunks, then
one GET each (concurrently on an object store).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tessera.platform.errors import PlatformError
from tessera.storage import Store

SUFFIX = ".chunk"
DIGITS = 12
MAX_HEADER = 256      # bytes: a header is about 50
FETCHERS = 16         # concurrent GETs when a reader catches up on an object store


class ArtifactError(PlatformError):
    """What is in the artifacts store is not what Tessera wrote there (a chunk that is not one)."""


@dataclass(frozen=True)
class ChainEnd:
    """Where a chain stands: the next chunk's seq, and the local file range its last chunk came from
    (`resumption`, and `local`: the byte offset after it), which is where shipping goes on."""
    seq: int = 0
    resumption: int = -1
    local: int = 0


@dataclass(frozen=True)
class Chunk:
    seq: int
    resumption: int
    start: int        # local byte range [start, end) the payload was made from
    end: int
    payload: bytes


class Chain:
    """The chunks under `prefix` (ending with '/') of `store`."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def key(self, seq: int) -> str:
        return f"{self.prefix}{seq:0{DIGITS}d}{SUFFIX}"

    def _seq(self, key: str) -> int | None:
        name = key[len(self.prefix):]
        digits = name.removesuffix(SUFFIX)
        if name == digits or len(digits) != DIGITS or not digits.isdigit():
            return None       # not a chunk (a temporary file of another writer, a stray object)
        return int(digits)

    def listed(self, after: int = 0) -> Iterator[tuple[int, int]]:
        """(seq, object size) of the chunks from seq `after` on, in order, up to the first gap (none is
        expected: a writer creates seq n+1 only once it knows n exists)."""
        start_after = f"{self.prefix}{after:0{DIGITS}d}" if after else ""
        expected = after
        for info in self.store.list(self.prefix, start_after=start_after):
            seq = self._seq(info.key)
            if seq is None:
                continue
            if seq != expected:
                return
            yield seq, info.size
            expected += 1

    def end(self) -> ChainEnd:
        """The chain's end (one LIST, and one GET of its last chunk's header)."""
        last = None
        for seq, _ in self.listed():
            last = seq
        if last is None:
            return ChainEnd()
        chunk = self.get(last)
        return ChainEnd(last + 1, chunk.resumption, chunk.end)

    def append(self, at: ChainEnd, resumption: int, start: int, end: int, payload: bytes) -> bool:
        """Write chunk `at.seq` (local bytes [start, end) of `resumption`, as `payload`) if no one has;
        False if another writer got there first (then `end()` says where the chain is)."""
        header = json.dumps({"resumption": resumption, "from": start, "to": end}).encode() + b"\n"
        return self.store.put_if_absent(self.key(at.seq), header + payload)

    def get(self, seq: int) -> Chunk:
        key = self.key(seq)
        return self._parse(seq, key, self.store.get(key))

    def read(self, after: int = 0, limit: int | None = None) -> tuple[list[Chunk], bool]:
        """(the chunks from seq `after` on, in order; whether more are there). With `limit`, only as many
        as hold about `limit` bytes (at least one), so a reader far behind catches up in pages."""
        seqs, size = [], 0
        for seq, length in self.listed(after):
            if limit is not None and seqs and size + length > limit:
                return self._fetch(seqs), True
            seqs.append(seq)
            size += length
        return self._fetch(seqs), False

    def _fetch(self, seqs: list[int]) -> list[Chunk]:
        if len(seqs) <= 1 or self.store.local_path(self.key(seqs[0])) is not None:
            return [self.get(seq) for seq in seqs]
        with ThreadPoolExecutor(min(FETCHERS, len(seqs))) as pool:
            return list(pool.map(self.get, seqs))

    def _parse(self, seq: int, key: str, data: bytes) -> Chunk:
        newline = data.find(b"\n", 0, MAX_HEADER)
        try:
            if newline < 0:
                raise ValueError("no header line")
            header = json.loads(data[:newline])
            resumption, start, end = (header[k] for k in ("resumption", "from", "to"))
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (resumption, start, end)) \
                    or not 0 <= start <= end:
                raise ValueError(f"bad header {header!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise ArtifactError(f"{self.store.url_for(key)}: not a log chunk written by Tessera ({exc})") from None
        return Chunk(seq, resumption, start, end, data[newline + 1:])

