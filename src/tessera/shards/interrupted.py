"""What a write that was interrupted (a `convert` killed mid-way) left behind, read from its journal.

A writer records every shard it has confirmed in `index.partial.json` (session.py) and deletes the
journal once index.json is committed, so a journal in the store means a write that never finished. Its
shard files are then only part of the data, and not even a prefix of it: shards are stored by parallel
threads, so shard 7 may be stored while shard 6 is not. An index rebuilt from whatever files exist would
look complete and silently miss samples, in the middle as well as at the end. So `repair` refuses such a
store (`InterruptedWrite`, naming what is complete and how to resume), and when the caller insists on a
partial index, only the complete prefix goes in: the shards the journal confirmed, then the shards that
follow them with no number missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from tessera.shards.errors import ShardError
from tessera.shards.index import DatasetIndex, shard_key
from tessera.shards.layout import shard_number
from tessera.shards.session import JOURNAL_BASENAME, JOURNAL_KEY
from tessera.storage import NotFound, Store


@dataclass(frozen=True)
class Interrupted:
    """The journal of an interrupted write: what it confirmed (a resume keeps exactly that) and where
    its next shard would have gone; `files` counts the shard files the store holds."""

    state: str
    shards: int
    samples: int
    last: str | None
    files: int
    confirmed: frozenset[str]
    replaced: frozenset[str]  # shards of the dataset an interrupted overwrite was replacing
    next_folder: str
    next_number: int

    def complete_prefix(self, found: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
        """Split the raw shard names found in the store (sorted by folder, then number) into the complete
        prefix of this write and the rest, each left-out name with the reason."""
        keep: list[str] = []
        left: list[tuple[str, str]] = []
        expected = self.next_number
        for name in found:
            folder, number = _folder(name), shard_number(name)
            if name in self.confirmed:
                keep.append(name)
            elif name in self.replaced:
                left.append((name, "belongs to the dataset the interrupted overwrite was replacing"))
            elif folder == self.next_folder and number == expected:
                keep.append(name)
                expected += 1
            else:
                left.append((name, f"not in the complete prefix of the interrupted write (shard number "
                                   f"{expected} is missing before it)"))
        return keep, left


class InterruptedWrite(ShardError, RuntimeError):
    """The dataset's write was interrupted: an index rebuilt from its shard files would be partial."""

    def __init__(self, url: str, found: Interrupted | None = None) -> None:
        self.url = url
        self.found = found
        if found is None:  # rebuilt from its message alone (see ShardError.__reduce__)
            super().__init__(url)
            return
        finished = "had finished and was committing" if found.state == "committing" else "was interrupted"
        last = f" (up to {found.last})" if found.last else ""
        super().__init__(
            f"{url}: a write {finished} ({JOURNAL_BASENAME} is present): it confirmed {found.shards} shards with "
            f"{found.samples:,} samples{last}, and {found.files} shard files are stored; finish it with the "
            f"same `tessera data convert INPUT {url} --mode resume` (it keeps the confirmed shards), or pass "
            "allow_partial (--allow-partial) to commit the complete prefix as a partial dataset")


def _folder(name: str) -> str:
    return str(PurePosixPath(name).parent)


def interrupted_write(store: Store, found: list[str]) -> Interrupted | None:
    """What an interrupted write left (from its journal), or None when no write was in flight.

    `found` are the raw shard names in the store, which the summary counts."""
    try:
        text = store.get(JOURNAL_BASENAME)
    except NotFound:
        return None
    journal = DatasetIndex.from_json(text, store.url_for(JOURNAL_BASENAME), strict=False)
    meta = journal.extensions.get(JOURNAL_KEY)
    meta = meta if isinstance(meta, dict) else {}
    replaces = meta.get("replaces")
    replaced = [shard_key(obj["raw_data"]["basename"]) for obj in (replaces if isinstance(replaces, list) else [])
                if isinstance(obj, dict) and isinstance(obj.get("raw_data"), dict)
                and isinstance(obj["raw_data"].get("basename"), str)]
    confirmed = [shard_key(e.raw_data.basename) for e in journal.shards]
    if confirmed:  # the writer numbers its shards one after another from the last confirmed one
        next_folder, next_number = _folder(confirmed[-1]), (shard_number(confirmed[-1]) or 0) + 1
    else:  # nothing confirmed: the first new shard follows any that are being replaced
        numbers = [shard_number(name) for name in replaced]
        next_folder, next_number = ".", max([n for n in numbers if n is not None], default=-1) + 1
    last = journal.shards[-1].raw_data.basename if journal.shards else None
    return Interrupted(str(meta.get("state") or "unknown"), len(journal.shards), journal.num_samples, last,
                       len(found), frozenset(confirmed), frozenset(replaced), next_folder, next_number)
