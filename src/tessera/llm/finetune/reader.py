"""Read fine-tuning records, in bounded memory, each with its place in the input.

Inputs: JSONL files (`.jsonl`, `.json`, `.ndjson`, each also gzip-compressed as `.gz`), Parquet files, or
local text files (one example each); a file, a folder of them, or objects in a bucket; or an MDS dataset
(a folder with index.json, as LLM Foundry's convert_finetuning_dataset.py writes prompt/response rows),
read a sample at a time. They are cut into
chunks that depend only on the input (`plan_examples`): byte ranges of plain JSONL, one chunk per
gzip file (a gzip stream cannot be entered in the middle), Parquet row groups, groups of text files.

`ChunkRecords(chunk, max_record_bytes)` yields `(position, record)`: the line (0-based within the chunk),
row or file, and a parsed JSON object, or a `BadRecord` saying why that line is not one (not UTF-8, not
JSON, nested too deeply, longer than `max_record_bytes`). Lines are read in blocks: a line over the bound
is counted to its end and never held, one within it is held at most twice (its text while it is parsed).
What cannot be read on at all (a gzip file cut short) raises `SourceError` naming the file and the line
reached. `Places` turns positions into "FILE, line N" as the chunks are taken in input order, so the
workers need not count the lines before their chunk.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import zlib
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from tessera.llm.corpus import plan_corpus
from tessera.shards.inputs import InputNotFound, is_url, list_input, open_input, read_all
from tessera.shards.sources import Chunk, SourceError, detect_format, plan_chunks, read_row_group

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
GZIP_JSONL = "jsonl.gz"  # the kind of a chunk that is a whole gzip-compressed JSONL file
BLOCK = 1 << 20  # bytes read at a time
DEFAULT_MAX_RECORD_BYTES = 128 << 20
MDS_CHUNK = 4096  # samples of an MDS input per chunk


@dataclass(frozen=True)
class BadRecord:
    """A line that is not a record: why."""

    reason: str


Records = Iterator[tuple[int, Any]]  # (position in the chunk, record or BadRecord)


def _jsonl_file(path: str) -> str | None:
    """"jsonl" or GZIP_JSONL for a JSONL file name (`.jsonl`, `.jsonl.gz`...), else None."""
    name = path.lower()
    gz = name.endswith(".gz")
    return (GZIP_JSONL if gz else "jsonl") if name.removesuffix(".gz").endswith(JSONL_SUFFIXES) else None


def plan_examples(inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Chunk]:
    """Chunks of every input, in order (module docstring)."""
    items = [inputs] if isinstance(inputs, str | os.PathLike) else list(inputs)
    chunks: list[Chunk] = []
    for item in items:
        path = os.fspath(item)
        if samples := _mds_samples(path):
            chunks += [Chunk("mds", path, start, min(start + MDS_CHUNK, samples))
                       for start in range(0, samples, MDS_CHUNK)]
            continue
        try:
            files = [f for _, f in list_input(path).files]
        except InputNotFound as exc:
            raise SourceError(str(exc)) from None
        if files and all(_jsonl_file(f) for f in files):
            for f in files:
                chunks += [Chunk(GZIP_JSONL, f)] if _jsonl_file(f) == GZIP_JSONL else plan_chunks(f, "jsonl")
            continue
        kind = detect_format(path)
        if kind == "parquet":
            chunks += plan_chunks(path, kind)
        elif kind == "text" and not is_url(path):
            chunks += plan_corpus(path, "text")
        else:
            raise SourceError(f"{path}: fine-tuning examples are read from JSONL (.jsonl, .jsonl.gz), Parquet or "
                              f"MDS (or local text files), not {kind}")
    if not chunks:
        raise SourceError(f"{', '.join(map(os.fspath, items))}: no input files")
    return chunks


def _mds_samples(path: str) -> int:
    """The samples of the MDS dataset at `path` (0 when it is not one: no index.json there)."""
    from tessera.shards.dataset import MDSDataset
    from tessera.storage import StorageError, open_store

    if not is_url(path) and not os.path.isdir(path):
        return 0
    try:
        if not open_store(path).exists("index.json"):
            return 0
        with MDSDataset(path) as dataset:
            return len(dataset)
    except (StorageError, OSError, ValueError):  # not a store, or no dataset there: other inputs decide
        return 0


class ChunkRecords:
    """The records of one chunk with their positions (iterate once); then `covered`, the lines (rows)
    the chunk went through, which the next chunk of the same file starts after (`Places`)."""

    def __init__(self, chunk: Chunk, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self.chunk, self.limit, self.covered = chunk, max_record_bytes, 0

    def __iter__(self) -> Records:
        chunk = self.chunk
        if chunk.kind == "parquet":
            rows = read_row_group(chunk).to_pylist()
            self.covered = len(rows)
            yield from enumerate(rows)
        elif chunk.kind == "mds":
            from tessera.shards.dataset import MDSDataset

            with MDSDataset(chunk.path) as dataset:
                for index in range(chunk.start, chunk.stop):
                    yield index - chunk.start, dataset.get(index)
            self.covered = chunk.stop - chunk.start
        elif chunk.kind == "text":
            yield from _text_files(chunk, self.limit)
        elif chunk.kind == GZIP_JSONL:
            with open_input(chunk.path) as raw, gzip.GzipFile(fileobj=raw) as f:
                self.covered = yield from _jsonl(f, None, chunk.path, self.limit)
        else:
            with open_input(chunk.path) as f:
                f.seek(chunk.start)
                self.covered = yield from _jsonl(f, chunk.stop - chunk.start, chunk.path, self.limit)


def _text_files(chunk: Chunk, max_record_bytes: int) -> Records:
    for i, f in enumerate(chunk.files):
        size = os.path.getsize(f)
        if size > max_record_bytes:
            yield i, BadRecord(_too_long(size, max_record_bytes))
            continue
        try:
            yield i, {"text": read_all(f).decode("utf-8")}
        except UnicodeDecodeError as exc:
            yield i, BadRecord(f"not UTF-8 ({exc.reason} at byte {exc.start})")


def _too_long(size: int, limit: int) -> str:
    return (f"a record of {size:,} bytes, over the limit of {limit:,} (raise it with --max-record-bytes / "
            "data.*.max_record_bytes)")


class _Line:
    """The line being read: decoded as its blocks come, dropped once it is over the bound or not UTF-8."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.parts: list[str] = []
        self.bad: str | None = None
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.bad is not None:
            return
        if self.size > self.limit:
            self.bad, self.parts = "", []  # the reason needs the whole size: see `record`
            return
        try:
            self.parts.append(self.decoder.decode(piece))
        except UnicodeDecodeError as exc:
            self._not_utf8(exc, self.size - len(piece))

    def _not_utf8(self, exc: UnicodeDecodeError, before: int) -> None:
        self.bad, self.parts = f"not UTF-8 ({exc.reason} at byte {before + exc.start} of the line)", []

    def record(self) -> Any:
        """The line's JSON object, a BadRecord, or None for a blank line."""
        if self.bad == "":
            return BadRecord(_too_long(self.size, self.limit))
        if self.bad is None:
            try:
                self.parts.append(self.decoder.decode(b"", final=True))
            except UnicodeDecodeError as exc:
                self._not_utf8(exc, self.size)
        if self.bad is not None:
            return BadRecord(self.bad)
        text = "".join(self.parts)
        self.parts = []
        if not text.strip():
            return None
        return parse_json(text)


def parse_json(text: str) -> Any:
    """The JSON value of one line, or a BadRecord: bad JSON, or nested deeper than Python's recursion limit."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return BadRecord(f"bad JSON: {exc.msg} (column {exc.colno})")
    except RecursionError:
        return BadRecord("JSON nested too deeply to read (over Python's recursion limit)")


def _jsonl(f: BinaryIO, length: int | None, path: str, limit: int) -> Generator[tuple[int, Any], None, int]:
    """Lines of `f` from where it stands, `length` bytes (None: to the end), each parsed (module docstring);
    returns the number of lines."""
    index, line, left = 0, _Line(limit), length
    while left is None or left > 0:
        block = _read(f, BLOCK if left is None else min(BLOCK, left), path, index)
        if not block:
            break
        if left is not None:
            left -= len(block)
        pos = 0
        while (end := block.find(b"\n", pos)) >= 0:
            line.add(block[pos:end])
            record, line = line.record(), _Line(limit)
            if record is not None:
                yield index, record
            index, pos = index + 1, end + 1
        line.add(block[pos:])
    if not line.size:
        return index
    record = line.record()
    if record is not None:
        yield index, record
    return index + 1


def _read(f: BinaryIO, size: int, path: str, index: int) -> bytes:
    try:  # a gzip file: what one read decompresses (read1), so the lines before a cut are still read
        return f.read1(size) if isinstance(f, gzip.GzipFile) else f.read(size)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise SourceError(f"{path}, line {index + 1}: the gzip data ends or breaks here ({exc}); the file is cut "
                          "short or corrupt") from None


class Places:
    """Where a record is, as "FILE, line N" (1-based), "FILE, row N" (Parquet, 0-based as `convert` says it)
    or the text file: chunks must be given in input order (`enter`), each with the lines it covered."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.before = 0  # lines (rows) of the current file in the chunks before this one
        self.chunk: Chunk | None = None

    def enter(self, chunk: Chunk) -> None:
        if chunk.path != self.path or chunk.kind == "text":
            self.path, self.before = chunk.path, 0
        self.chunk = chunk

    def leave(self, covered: int) -> None:
        self.before += covered

    def where(self, position: int) -> str:
        chunk = self.chunk
        assert chunk is not None, "enter a chunk first"
        if chunk.kind == "text":
            return chunk.files[position]
        if chunk.kind == "parquet":
            return f"{chunk.path}, row {self.before + position}"
        if chunk.kind == "mds":
            return f"{chunk.path}, sample {self.before + position}"
        return f"{chunk.path}, line {self.before + position + 1}"


__all__ = ["DEFAULT_MAX_RECORD_BYTES", "BadRecord", "ChunkRecords", "Places", "parse_json", "plan_examples"]
