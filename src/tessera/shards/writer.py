"""`ShardWriter`: samples in, MDS shards and a committed index.json out, to a folder or any store.

Byte-compatible with MosaicML's MDSWriter: for the same samples and settings the shard files and
index.json are identical (gzip aside, whose header holds a time). Faster, because per-sample work is
only encoding: each column's encoder is resolved once, a sample's bytes are appended to one growing
buffer (a static ndarray is appended straight from its memory), and the header with its offsets is
computed once per shard from the recorded sizes. Hashing, compression and the upload run in background
threads (see `pipeline.py`), and the dataset is committed atomically (see `session.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from tessera.shards.compression import parse_compression
from tessera.shards.dataset import open_dataset_store
from tessera.shards.encodings import Buffer
from tessera.shards.hashing import normalize_hashes
from tessera.shards.index import FileInfo, ShardEntry
from tessera.shards.layout import config_bytes, shard_basenames
from tessera.shards.pipeline import PendingShard, ShardTemplate, ShardUploader
from tessera.shards.provenance import InputId, Provenance, Segment, SourceRecorder
from tessera.shards.samples import SampleEncoder
from tessera.shards.session import WriteSession, commit, plan_session, write_journal
from tessera.shards.sizes import parse_size
from tessera.storage import Store

DEFAULT_SIZE_LIMIT = 1 << 26
logger = logging.getLogger(__name__)
JOURNAL_INTERVAL = 1.0  # seconds between journal rewrites (a resume redoes at most this much work)


def size_limit_bytes(value: int | str | None) -> int | None:
    """The size limit in bytes, None for "one shard" (None or 0, as in MDS); ValueError out of range."""
    limit = parse_size(value) if value else None  # 0 and None both mean "one shard", as in MDS
    if limit is not None and not 0 < limit < 1 << 32:
        raise ValueError(f"size_limit must be between 1 byte and 4 GiB (32-bit offsets), got {value!r}")
    return limit or None


class ShardWriter:
    """Write an MDS dataset.

    Args:
        out: local folder or storage URL (s3://, gs://, memory://, ...), or a `Store`.
        columns: {name: MDS encoding}, e.g. {"tokens": "ndarray:uint16:2048", "label": "int"}.
        compression: None or "zstd", "zstd:7", "br:11", "bz2", "gz:9", "snappy".
        hashes: digest algorithms recorded per shard file (any hashlib name, xxh3_64, xxh64, ...).
        size_limit: start a new shard before one would exceed this many bytes (int or "64mb").
        mode: "create" refuses an existing dataset; "append" adds shards after the committed ones;
            "resume" continues an interrupted write (see `resumed_samples`); "overwrite" replaces the
            dataset, deleting the old shards only after the new index is committed.
        max_pending: shards being hashed, compressed or uploaded at once (bounds memory).
        sources: the inputs the samples come from (`convert`'s): `write_encoded(..., source=)` then says
            which rows each batch is, and the index records which rows each shard holds (provenance.py).

    Use as a context manager: leaving the block normally commits index.json; an exception commits
    nothing new (the previous dataset stays valid) and leaves a journal for `mode="resume"`.
    """

    def __init__(self, out: str | Path | Store, columns: Mapping[str, str], compression: str | None = None,
                 hashes: Iterable[str] | None = None, size_limit: int | str | None = "64mb",
                 mode: str = "create", max_pending: int = 4, sources: Sequence[InputId] | None = None) -> None:
        self.store = open_dataset_store(out)
        label = self.store.url
        self._encoder = SampleEncoder(columns, label)
        self._columns = self._encoder.columns
        codec = parse_compression(compression)
        self.size_limit = size_limit_bytes(size_limit)
        entry = ShardEntry(format="mds", samples=0, raw_data=FileInfo("-", 0), zip_data=None,
                           compression=codec.text if codec else None, hashes=normalize_hashes(hashes),
                           size_limit=self.size_limit, column_names=[c.name for c in self._columns],
                           column_encodings=[c.encoding for c in self._columns],
                           column_sizes=[c.size for c in self._columns])
        config = config_bytes(entry.config())
        self.session: WriteSession = plan_session(self.store, mode)
        self._check_compatible(entry)
        self.sources: SourceRecorder | None = None
        if sources is not None:
            self.session.inputs = [item.to_json() for item in sources]
            self.sources = SourceRecorder(Provenance.from_extensions(self.session.extensions, label), sources)
        self._template = ShardTemplate(config, codec, entry)
        self._uploader = ShardUploader(self.store, self._template, self.session.next_number, max_pending,
                                       self._journal)
        self._header_size = 8 + len(config)
        self._next_number = self.session.next_number
        self._may_emit_empty = not self.session.shards  # MDS quirk: only before a dataset's first shard
        self.journal_interval = JOURNAL_INTERVAL
        self._journal_due = 0.0
        self._new_buffer()
        self.samples_written = 0
        self._closed = False
        if self.session.mode != "create" or self.session.shards:
            self._write_journal(self.session.shards)  # mark the write as in progress

    def get_config(self) -> dict[str, Any]:
        """The writer's settings as MosaicML's `MDSWriter.get_config()` returns them (every shard embeds
        this object as its config JSON): version, format, compression, hashes, size_limit and the
        column names, encodings and fixed sizes in column order."""
        entry = self._template.entry
        return {"version": 2, "format": "mds", "compression": entry.compression, "hashes": list(entry.hashes),
                "size_limit": entry.size_limit, "column_names": list(entry.column_names),
                "column_encodings": list(entry.column_encodings), "column_sizes": list(entry.column_sizes)}

    @property
    def resumed_samples(self) -> int:
        """Samples an interrupted write had stored and this writer kept (skip that many inputs)."""
        return self.session.resumed_samples

    @property
    def committed_samples(self) -> int:
        """Samples in the shards this writer started from."""
        return self.session.committed_samples

    def _check_compatible(self, entry: ShardEntry) -> None:
        ours = dict(zip(entry.column_names, entry.column_encodings, strict=True))
        for old in self.session.shards:
            theirs = dict(zip(old.column_names, old.column_encodings, strict=True))
            if theirs != ours:
                raise ValueError(f"{self.store.url}: columns {ours} differ from the dataset's {theirs}; use "
                                 "mode='overwrite' or another folder")

    def _new_buffer(self) -> None:
        self._body = bytearray()  # samples added by `write`, after the sealed parts
        self._sizes: list[int] = []
        self._parts: list[Buffer] = []  # sealed body pieces: slices of `write_encoded` bodies, older `_body`s
        self._sealed: list[np.ndarray] = []  # their sample sizes
        self._shard_size = self._header_size

    def _extensions(self, shards: list[ShardEntry]) -> dict[str, Any] | None:
        """The index's top-level keys for `shards`: the session's, with their provenance when recorded."""
        return self.sources.extensions(self.session.extensions, shards) if self.sources is not None else None

    def _write_journal(self, shards: list[ShardEntry]) -> None:
        write_journal(self.store, self.session, shards, extensions=self._extensions(shards))

    def check_resumed(self, runs: Sequence[Segment]) -> None:
        """The samples a resumed write kept (`resumed_samples`) are these rows of `sources`, in order (as
        (source, first, stop)): recorded as their shards' provenance, or checked against the journal's."""
        if self.sources is not None:
            self.sources.resumed(self.session.shards[self.session.base_shards:], runs, self.store.url)

    def _journal(self, confirmed: list[ShardEntry]) -> None:
        """Record confirmed shards for `mode="resume"`, throttled: the journal names every shard, so
        rewriting it per shard would cost O(shards^2); at most ~5% of the time goes to it."""
        now = time.monotonic()
        if now < self._journal_due:
            return
        self._write_journal(self.session.shards + confirmed)
        spent = time.monotonic() - now
        self._journal_due = time.monotonic() + max(self.journal_interval, 20 * spent)

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample ({column: value}); may cut the current shard and hand it to the uploader."""
        if self._closed:
            raise ValueError(f"{self.store.url}: the writer is closed")
        self._uploader.raise_if_failed()
        parts, size = self._encoder.encode(sample)
        limit = self.size_limit
        if limit is not None and limit < self._shard_size + size + 4 and (
                self._sizes or self._sealed or self._may_emit_empty):
            self._flush()
        self._may_emit_empty = False
        if self.sources is not None:
            self.sources.unknown()
        body = self._body
        for part in parts:
            body += part
        self._sizes.append(size)
        self._shard_size += size + 4
        self.samples_written += 1

    def write_encoded(self, sizes: Sequence[int] | np.ndarray, body: Buffer,
                      source: tuple[int, int] | None = None) -> None:
        """Add samples encoded elsewhere (by a `SampleEncoder` in a convert worker): sample i is the next
        `sizes[i]` bytes of `body`. Shards are cut exactly where `write` would cut them, so the dataset is
        the same bytes; `body` is sliced, not copied, and must not change until `finish`. `source`:
        (index into `sources`, row of the first sample); the samples are that input's consecutive rows."""
        if self._closed:
            raise ValueError(f"{self.store.url}: the writer is closed")
        self._uploader.raise_if_failed()
        sizes = np.asarray(sizes, dtype=np.int64)
        count = len(sizes)
        view = memoryview(body).cast("B")  # slices count bytes, whatever the buffer's item type
        ends = np.cumsum(sizes)
        if (int(ends[-1]) if count else 0) != view.nbytes:
            raise ValueError(f"{self.store.url}: sample sizes add up to {ends[-1] if count else 0} bytes, "
                             f"the body has {view.nbytes}")
        steps = ends + 4 * np.arange(1, count + 1)  # what samples [0, i] add to a shard (offsets included)
        self._seal_tail()
        limit = self.size_limit
        start = 0
        while start < count:
            stop = count
            if limit is not None:
                stop = self._fitting(steps, start, limit)
                if stop == start:  # the next sample does not fit: cut, as `write` would
                    if self._sealed or self._may_emit_empty:
                        self._flush()
                        stop = self._fitting(steps, start, limit)
                    stop = max(stop, start + 1)  # a sample larger than the limit goes alone
            lo, hi = int(ends[start - 1]) if start else 0, int(ends[stop - 1])
            self._parts.append(view[lo:hi])
            self._sealed.append(sizes[start:stop])
            if self.sources is not None:
                if source is None:
                    self.sources.unknown()
                else:
                    self.sources.add(source[0], source[1] + start, stop - start)
            self._shard_size += hi - lo + 4 * (stop - start)
            self._may_emit_empty = False
            self.samples_written += stop - start
            start = stop

    def _fitting(self, steps: np.ndarray, start: int, limit: int) -> int:
        """One past the last sample from `start` on that still fits the current shard."""
        base = int(steps[start - 1]) if start else 0
        return max(start, int(np.searchsorted(steps, base + limit - self._shard_size, side="right")))

    def _seal_tail(self) -> None:
        """Move the samples `write` appended into the sealed parts (before a `write_encoded` batch)."""
        if self._sizes:
            self._parts.append(self._body)
            self._sealed.append(np.asarray(self._sizes, dtype=np.int64))
            self._body = bytearray()
            self._sizes = []

    def _flush(self) -> None:
        if self.sources is not None:
            self.sources.cut(shard_basenames(self._next_number, "mds", None)[0])
        if self._parts:
            self._seal_tail()
            shard = PendingShard(self._next_number, np.concatenate(self._sealed), self._parts)
        else:
            shard = PendingShard(self._next_number, self._sizes, [self._body])
        self._next_number += 1
        self._new_buffer()
        self._uploader.submit(shard)

    def finish(self) -> list[ShardEntry]:
        """Store the last shard, wait for all uploads, then commit index.json. Returns the index's shards."""
        if self._closed:
            raise ValueError(f"{self.store.url}: the writer is closed")
        if self._sizes or self._sealed:
            self._flush()
        self._closed = True
        try:
            confirmed = self._uploader.wait()
        except BaseException:
            self._uploader.close()
            self._journal_confirmed()
            raise
        self._uploader.close()
        shards = self.session.shards + confirmed
        commit(self.store, self.session, shards, self._extensions(shards))
        return shards

    def abort(self) -> None:
        """Stop without committing: in-flight shards finish and the journal records every confirmed one,
        index.json is left as it was, and `mode="resume"` can continue later."""
        if self._closed:
            return
        self._closed = True
        self._new_buffer()
        self._uploader.close()
        self._journal_confirmed()

    def _journal_confirmed(self) -> None:
        """After a failure: record every confirmed shard so a resume keeps them (best effort)."""
        if not self._uploader.confirmed and self.session.mode == "create":
            return
        try:
            self._write_journal(self.session.shards + self._uploader.confirmed)
        except Exception:  # never hide the error that made us stop
            logger.warning("%s: could not update the write journal", self.store.url, exc_info=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            if not self._closed:  # finish() may already have been called inside the block
                self.finish()
        else:
            self.abort()


MOSAIC_WRITER_OPTIONS = ("progress_bar", "max_workers", "retry", "exist_ok")


def mosaic_target(out: str | tuple[str, str], options: Mapping[str, Any], mode: str | None) -> tuple[str, str]:
    """(where to write, mode) from MosaicML's writer arguments: `out` is a folder or URL, or a (local,
    remote) pair whose remote is written (Tessera uploads directly: no local staging copy);
    `exist_ok=True` replaces an existing dataset. Unknown options are refused as MosaicML refuses them."""
    unknown = sorted(set(options) - set(MOSAIC_WRITER_OPTIONS))
    if unknown:
        raise ValueError(f"invalid writer argument(s) {unknown}; MosaicML's writers take {list(MOSAIC_WRITER_OPTIONS)}")
    target = out[1] if isinstance(out, tuple) else out
    return target, mode or ("overwrite" if options.get("exist_ok") else "create")


class MDSWriter(ShardWriter):
    """`ShardWriter` with MosaicML's `MDSWriter` signature (keyword-only `columns`, `out`, ...), for code
    switched by changing its import. `mode` is Tessera's (create, append, resume, overwrite)."""

    def __init__(self, *, columns: Mapping[str, str], out: str | tuple[str, str], keep_local: bool = False,
                 compression: str | None = None, hashes: Iterable[str] | None = None,
                 size_limit: int | str | None = DEFAULT_SIZE_LIMIT, mode: str | None = None, **options: Any) -> None:
        target, mode = mosaic_target(out, options, mode)
        self.keep_local = keep_local
        super().__init__(target, columns, compression, hashes, size_limit, mode)
