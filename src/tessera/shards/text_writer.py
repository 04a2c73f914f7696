"""Writers of MosaicML's text shard formats: JSON lines (`JSONWriter`) and CSV/TSV/XSV (`XSVWriter`).

A text shard is two files: the data (one text line per sample; CSV/TSV/XSV data start with a line of
column names) and a `.meta` file (`u32 N`, `u32 offsets[N+1]` into the data file, the writer's config
JSON). For the same samples and settings both files and index.json are byte-identical to those of
MosaicML's writers (gzip aside: its header holds a time), shards are cut where Mosaic cuts them (the
size limit counts sample bytes only, and a first sample larger than the limit leaves an empty shard
before it), and they are committed as `ShardWriter` commits: atomic files, then index.json last, with
the same modes (create, append, resume, overwrite). Shards are stored on the caller's thread: these
formats are for small tabular data, not for the bulk path.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from tessera.shards.compression import Compression, parse_compression
from tessera.shards.dataset import open_dataset_store
from tessera.shards.errors import ColumnMismatch, EncodeError, EncodeTypeError, UnknownEncoding, WriterError
from tessera.shards.hashing import digest_parts, normalize_hashes
from tessera.shards.index import FileInfo, ShardEntry
from tessera.shards.layout import shard_basenames
from tessera.shards.pipeline import put_parts
from tessera.shards.session import WriteSession, commit, plan_session, write_journal
from tessera.shards.writer import DEFAULT_SIZE_LIMIT, JOURNAL_INTERVAL, mosaic_target, size_limit_bytes
from tessera.storage import Store

TEXT_TYPES: dict[str, type] = {"str": str, "int": int, "float": float}


class TextShardWriter:
    """Common part of the JSON and XSV writers: cutting, storing and committing split shards."""

    format = ""

    def __init__(self, out: str | Path | Store | tuple[str, str], columns: Mapping[str, str], newline: str,
                 compression: str | None, hashes: Iterable[str] | None, size_limit: int | str | None,
                 mode: str | None, options: Mapping[str, Any]) -> None:
        target, mode = mosaic_target(out, options, mode) if isinstance(out, str | tuple) else (out, mode or "create")
        self.store = open_dataset_store(target)
        if not columns:
            raise ValueError("columns must name at least one column, e.g. {'text': 'str'}")
        for name, encoding in columns.items():
            if encoding not in TEXT_TYPES:
                raise UnknownEncoding(self.store.url, name, encoding)
        self.columns = dict(columns)
        self.newline = newline
        self._codec: Compression | None = parse_compression(compression)
        self.compression = self._codec.text if self._codec else None
        self.hashes = normalize_hashes(hashes)
        self.size_limit = size_limit_bytes(size_limit)
        self.session: WriteSession = plan_session(self.store, mode)
        self._number = self.session.next_number
        self._may_emit_empty = not self.session.shards  # MDS quirk: only before a dataset's first shard
        self._samples: list[bytes] = []
        self._size = 0
        self._confirmed: list[ShardEntry] = []
        self._journal_due = 0.0
        self._closed = False

    def get_config(self) -> dict[str, Any]:
        """The writer's settings as MosaicML's writer of this format returns them (each .meta file
        embeds this object)."""
        return {"version": 2, "format": self.format, "compression": self.compression, "hashes": list(self.hashes),
                "size_limit": self.size_limit}

    def encode_sample(self, sample: Mapping[str, Any]) -> bytes:
        raise NotImplementedError

    def data_header(self) -> bytes:
        """Bytes before the first sample of every data file."""
        return b""

    def _value(self, sample: Mapping[str, Any], name: str) -> Any:
        """The sample's value of column `name`, checked against the column's type as Mosaic checks it."""
        encoding = self.columns[name]
        try:
            value = sample[name]
        except KeyError:
            raise ColumnMismatch(name, encoding, "missing from the sample") from None
        if not isinstance(value, TEXT_TYPES[encoding]):
            raise EncodeTypeError(name, encoding, f"expected {encoding}, got {type(value).__name__}")
        return value

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample ({column: value}); may cut the current shard and store it."""
        if self._closed:
            raise ValueError(f"{self.store.url}: the writer is closed")
        data = self.encode_sample(sample)
        limit = self.size_limit
        if limit is not None and limit < self._size + len(data) and (self._samples or self._may_emit_empty):
            self._flush()
        self._may_emit_empty = False
        self._samples.append(data)
        self._size += len(data)

    def _flush(self) -> None:
        header = self.data_header()
        sizes = np.array([0] + [len(s) for s in self._samples], dtype=np.int64)
        offsets = (len(header) + np.cumsum(sizes)).astype(np.uint32)
        config = json.dumps(self.get_config(), sort_keys=True).encode("utf-8")
        meta = np.uint32(len(self._samples)).tobytes() + offsets.tobytes() + config
        raw_data, zip_data = self._store(self._number, None, [header, *self._samples])
        raw_meta, zip_meta = self._store(self._number, "meta", [meta])
        obj = {**self.get_config(), "samples": len(self._samples), "raw_data": raw_data, "zip_data": zip_data,
               "raw_meta": raw_meta, "zip_meta": zip_meta}
        self._confirmed.append(ShardEntry.from_json(obj, self.store.url, self._number))
        self._number += 1
        self._samples, self._size = [], 0
        self._journal()

    def _store(self, number: int, extension: str | None, parts: list[bytes]) -> tuple[dict, dict | None]:
        """Put one file of a shard (compressed when set) and confirm it; its (raw, zip) FileInfo JSON."""
        suffix = f"{self.format}.{extension}" if extension else self.format
        raw_name, zip_name = shard_basenames(number, suffix, self._codec.family if self._codec else None)
        raw = FileInfo(raw_name, sum(len(p) for p in parts), digest_parts(self.hashes, parts))
        zipped = None
        if self._codec is not None and zip_name is not None:
            parts = [self._codec.compress(b"".join(parts))]
            zipped = FileInfo(zip_name, len(parts[0]), digest_parts(self.hashes, parts))
        stored = zipped or raw
        put_parts(self.store, stored.basename, parts)
        if self.store.head(stored.basename).size != stored.bytes:
            raise WriterError(f"{self.store.url_for(stored.basename)}: stored size differs from {stored.bytes}")
        return raw.to_json(), zipped.to_json() if zipped else None

    def _journal(self) -> None:
        """Record confirmed shards for `mode="resume"`, at most once a second (it names every shard)."""
        now = time.monotonic()
        if now >= self._journal_due:
            write_journal(self.store, self.session, self.session.shards + self._confirmed)
            self._journal_due = now + JOURNAL_INTERVAL

    def finish(self) -> list[ShardEntry]:
        """Store the last shard, then commit index.json. Returns the index's shards."""
        if self._closed:
            raise ValueError(f"{self.store.url}: the writer is closed")
        if self._samples:
            self._flush()
        self._closed = True
        shards = self.session.shards + self._confirmed
        commit(self.store, self.session, shards)
        return shards

    def abort(self) -> None:
        """Stop without committing; the journal names every stored shard, for `mode="resume"`."""
        if not self._closed:
            self._closed = True
            if self._confirmed:
                write_journal(self.store, self.session, self.session.shards + self._confirmed)

    def __enter__(self) -> TextShardWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.finish()


class JSONWriter(TextShardWriter):
    """MosaicML's JSON shard writer: one `json.dumps(sample, sort_keys=True)` line per sample.

    Columns are typed `str`, `int` or `float`; other keys of a sample are not stored.
    """

    format = "json"

    def __init__(self, *, columns: Mapping[str, str], out: str | Path | Store | tuple[str, str],
                 newline: str = "\n", keep_local: bool = False, compression: str | None = None,
                 hashes: Iterable[str] | None = None, size_limit: int | str | None = DEFAULT_SIZE_LIMIT,
                 mode: str | None = None, **options: Any) -> None:
        self.keep_local = keep_local
        super().__init__(out, columns, newline, compression, hashes, size_limit, mode, options)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "columns": dict(self.columns), "newline": self.newline}

    def encode_sample(self, sample: Mapping[str, Any]) -> bytes:
        obj = {name: self._value(sample, name) for name in self.columns}
        return (json.dumps(obj, sort_keys=True) + self.newline).encode("utf-8")


class XSVWriter(TextShardWriter):
    """MosaicML's separated-values shard writer: a line of column names (sorted), then one line per
    sample of `str(value)`s joined by `separator`. A value holding the separator or the newline is
    refused (it could not be read back)."""

    format = "xsv"

    def __init__(self, *, columns: Mapping[str, str], out: str | Path | Store | tuple[str, str],
                 separator: str, newline: str = "\n", keep_local: bool = False, compression: str | None = None,
                 hashes: Iterable[str] | None = None, size_limit: int | str | None = DEFAULT_SIZE_LIMIT,
                 mode: str | None = None, **options: Any) -> None:
        if not separator or not newline:
            raise ValueError(f"separator and newline must not be empty, got {separator!r} and {newline!r}")
        self.keep_local = keep_local
        self.separator = separator
        self.column_names = sorted(columns)
        self.column_encodings = [columns[name] for name in self.column_names]
        for name in self.column_names:
            if separator in name or newline in name:
                raise ValueError(f"column name {name!r} holds the separator {separator!r} or the newline")
        super().__init__(out, columns, newline, compression, hashes, size_limit, mode, options)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "column_names": list(self.column_names),
                "column_encodings": list(self.column_encodings), "separator": self.separator,
                "newline": self.newline}

    def data_header(self) -> bytes:
        return (self.separator.join(self.column_names) + self.newline).encode("utf-8")

    def encode_sample(self, sample: Mapping[str, Any]) -> bytes:
        values = []
        for name in self.column_names:
            text = str(self._value(sample, name))
            if self.separator in text or self.newline in text:
                raise EncodeError(name, self.columns[name], f"value {text[:50]!r} holds the separator "
                                  f"{self.separator!r} or the newline {self.newline!r}")
            values.append(text)
        return (self.separator.join(values) + self.newline).encode("utf-8")


class CSVWriter(XSVWriter):
    """MosaicML's CSV shard writer: an XSV writer whose separator is ","."""

    format = "csv"
    fixed_separator = ","

    def __init__(self, *, columns: Mapping[str, str], out: str | Path | Store | tuple[str, str],
                 newline: str = "\n", keep_local: bool = False, compression: str | None = None,
                 hashes: Iterable[str] | None = None, size_limit: int | str | None = DEFAULT_SIZE_LIMIT,
                 mode: str | None = None, **options: Any) -> None:
        super().__init__(columns=columns, out=out, separator=self.fixed_separator, newline=newline,
                         keep_local=keep_local, compression=compression, hashes=hashes, size_limit=size_limit,
                         mode=mode, **options)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        del config["separator"]  # implied by the format, as in MosaicML's index entries
        return config


class TSVWriter(CSVWriter):
    """MosaicML's TSV shard writer: an XSV writer whose separator is a tab."""

    format = "tsv"
    fixed_separator = "\t"
