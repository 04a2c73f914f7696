"""What a writer starts from and how it commits: modes, the write journal, the final commit.

index.json is the dataset's commit object: it only ever names shards already confirmed in the store,
and it is replaced in one atomic put. Progress of a write in flight goes to a separate journal,
`index.partial.json` (same schema as an index, plus a top-level `tessera_journal` object), rewritten each
time a new prefix of shards is confirmed. So a crash at any point leaves index.json as it was (the
previous dataset, or none), and `mode="resume"` can continue from the journal without rewriting
anything it names.

Commit order: journal marked "committing" with the final shard list -> index.json -> delete replaced
shards (overwrite) -> delete journal. A crash between the steps is finished by the next resume.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tessera.shards.errors import DatasetExists, IndexFormatError
from tessera.shards.index import INDEX_BASENAME, DatasetIndex, ShardEntry, shard_key
from tessera.shards.layout import shard_number
from tessera.storage import NotFound, Store

JOURNAL_BASENAME = "index.partial.json"
JOURNAL_KEY = "tessera_journal"
MODES = ("create", "append", "resume", "overwrite")
logger = logging.getLogger(__name__)


@dataclass
class WriteSession:
    """The starting state of one writer.

    `shards` are the shards the final index begins with (committed ones, plus those a resumed write had
    confirmed); the first `base_shards` of them predate the interrupted write. `replaces` are shards of
    an overwritten dataset, deleted once the new index is committed. `extensions` are the top-level keys
    the index will hold (a write may update them: `extensions=` of `write_journal` and `commit`).
    """

    mode: str
    shards: list[ShardEntry] = field(default_factory=list)
    base_shards: int = 0
    replaces: list[ShardEntry] = field(default_factory=list)
    extensions: dict[str, Any] = field(default_factory=dict)
    next_number: int = 0
    resumed_samples: int = 0
    inputs: list[Any] | None = None  # what the write converts (`convert`'s inputs), kept in its journal

    @property
    def committed_samples(self) -> int:
        return sum(entry.samples for entry in self.shards)


def _read(store: Store, key: str) -> DatasetIndex | None:
    try:
        text = store.get(key)
    except NotFound:
        return None
    return DatasetIndex.from_json(text, store.url_for(key))


def _next_number(entries: list[ShardEntry]) -> int:
    """One past the highest shard number in use, so new files never overwrite named ones."""
    numbers = [shard_number(entry.raw_data.basename) for entry in entries]
    known = [n for n in numbers if n is not None]
    return max([len(entries) - 1, *known]) + 1 if entries else 0


def shard_keys(entry: ShardEntry) -> list[str]:
    """Every file a shard entry can own in a store (a local raw copy may sit next to a compressed one)."""
    files = [entry.raw_data, entry.zip_data, entry.raw_meta, entry.zip_meta]
    return [shard_key(info.basename) for info in files if info is not None]


def plan_session(store: Store, mode: str) -> WriteSession:
    """Decide the writer's starting state from what the store holds and the requested mode."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    index = _read(store, INDEX_BASENAME)
    journal = _read(store, JOURNAL_BASENAME)
    committed = index.shards if index else []
    pending = journal.shards if journal else []
    if mode == "create":
        if index is not None or journal is not None:
            what = "a dataset (index.json)" if index is not None else "an interrupted write (index.partial.json)"
            raise DatasetExists(f"{store.url} already holds {what}; pass mode='append' to add shards, "
                                "mode='resume' to continue an interrupted write, or mode='overwrite' to replace it")
        return WriteSession("create")
    if mode == "overwrite":
        return WriteSession("overwrite", replaces=committed + [e for e in pending if e not in committed],
                            next_number=_next_number(committed + pending))
    if mode == "append" or journal is None:
        if journal is not None:
            logger.warning("%s: discarding an interrupted write's uncommitted shards (mode='append')", store.url)
        return WriteSession("append", list(committed), len(committed), [e for e in pending if e not in committed],
                            dict(index.extensions if index else {}), _next_number(committed + pending))
    return _resume(store, journal)


def _resume(store: Store, journal: DatasetIndex) -> WriteSession:
    label = store.url_for(JOURNAL_BASENAME)
    meta = journal.extensions.get(JOURNAL_KEY)
    if not isinstance(meta, dict) or meta.get("mode") not in ("create", "append", "overwrite"):
        raise IndexFormatError(label, f"missing or malformed {JOURNAL_KEY!r} object")
    base, replaces, extensions = meta.get("base_shards", 0), meta.get("replaces", []), meta.get("extensions", {})
    if not (isinstance(base, int) and 0 <= base <= len(journal.shards)) or not isinstance(replaces, list) \
            or not isinstance(extensions, dict) or not isinstance(meta.get("inputs", []), list):
        raise IndexFormatError(label, f"{JOURNAL_KEY}: base_shards must be 0..{len(journal.shards)}, replaces and "
                               "inputs lists and extensions an object")
    replaces = [ShardEntry.from_json(obj, label) for obj in replaces]
    extensions, inputs = dict(extensions), meta.get("inputs")
    resumed = sum(entry.samples for entry in journal.shards[base:])
    if meta.get("state") == "committing":
        # The interrupted writer had finished: redo its (idempotent) commit, then append after it.
        commit(store, WriteSession(meta["mode"], journal.shards, base, replaces, extensions, inputs=inputs),
               journal.shards)
        return WriteSession("append", list(journal.shards), len(journal.shards), extensions=extensions,
                            next_number=_next_number(journal.shards), resumed_samples=resumed, inputs=inputs)
    return WriteSession(meta["mode"], list(journal.shards), base, replaces, extensions,
                        _next_number(journal.shards + replaces), resumed, inputs)


def read_committed(store: Store) -> DatasetIndex | None:
    """The committed index.json, or None when there is none."""
    return _read(store, INDEX_BASENAME)


def read_journal(store: Store) -> tuple[DatasetIndex, dict[str, Any]] | None:
    """The journal of a write in flight and its `tessera_journal` object, or None when there is none."""
    journal = _read(store, JOURNAL_BASENAME)
    if journal is None:
        return None
    meta = journal.extensions.get(JOURNAL_KEY)
    if not isinstance(meta, dict):
        raise IndexFormatError(store.url_for(JOURNAL_BASENAME), f"missing or malformed {JOURNAL_KEY!r} object")
    return journal, meta


def journal_text(session: WriteSession, shards: list[ShardEntry], state: str,
                 extensions: dict[str, Any] | None = None) -> str:
    """The journal naming `shards` (all confirmed present) for `session` in `state`; `extensions` are
    those of the index it would commit (default: the session's)."""
    meta = {"state": state, "mode": session.mode, "base_shards": session.base_shards,
            "replaces": [entry.to_json() for entry in session.replaces],
            "extensions": session.extensions if extensions is None else extensions}
    if session.inputs is not None:
        meta["inputs"] = session.inputs
    return DatasetIndex(shards, {JOURNAL_KEY: meta}).to_json()


def write_journal(store: Store, session: WriteSession, shards: list[ShardEntry], state: str = "writing",
                  extensions: dict[str, Any] | None = None) -> None:
    store.put(JOURNAL_BASENAME, journal_text(session, shards, state, extensions).encode("utf-8"))


def commit(store: Store, session: WriteSession, shards: list[ShardEntry],
           extensions: dict[str, Any] | None = None) -> None:
    """Make `shards` the dataset: journal -> index.json -> delete replaced files -> drop journal.
    `extensions`: the index's top-level keys (default: the session's)."""
    extensions = session.extensions if extensions is None else extensions
    write_journal(store, session, shards, "committing", extensions)
    store.put(INDEX_BASENAME, DatasetIndex(shards, extensions).to_json().encode("utf-8"))
    kept = {key for entry in shards for key in shard_keys(entry)}
    stale = [key for entry in session.replaces for key in shard_keys(entry) if key not in kept]
    if stale:
        store.delete_many(stale)
    store.delete(JOURNAL_BASENAME)
