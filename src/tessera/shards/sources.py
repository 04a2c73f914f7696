"""Input readers for `convert`: JSONL, Parquet, CSV/TSV, text files and image folders.

Each source splits its input into *chunks* that depend only on the input (files, row groups, fixed
byte ranges snapped to line ends), never on the number of worker processes. Workers read chunks in
parallel and the writer consumes them in chunk order, so the dataset is the same whatever N is.
The input may be local or in a bucket (`inputs.py`): the same chunks, read the same way, give the
same dataset.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tessera.shards.hf_datasets import is_parquet_folder, read_arrow_file, saved_dataset_files
from tessera.shards.inputs import (
    InputNotFound,
    Listing,
    input_size,
    is_url,
    list_input,
    open_input,
    open_unbuffered,
    read_all,
    read_range,
)
from tessera.syntax_errors import excerpt, with_excerpt

LINE_CHUNK = 4 << 20  # bytes of JSONL / text lines per chunk (small enough to keep N workers busy)
FILES_PER_CHUNK = 256  # text or image files per chunk
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
JPEG_SUFFIXES = {".jpg", ".jpeg"}
FORMATS = ("jsonl", "parquet", "csv", "tsv", "text", "lines", "images", "arrow")


class SourceError(ValueError):
    """The input cannot be read as the requested format; the message names the file and line."""


@dataclass(frozen=True)
class Chunk:
    """One independently readable piece of the input (picklable, sent to worker processes)."""

    kind: str
    path: str
    start: int = 0  # byte offset, row group, or index into `files`
    stop: int = 0
    files: tuple[str, ...] = ()
    labels: tuple[int, ...] = ()


def _files(root: str, suffixes: set[str] | None = None) -> Listing:
    try:
        return list_input(root, suffixes)
    except InputNotFound as exc:
        raise SourceError(str(exc)) from None


def detect_format(path: str | Path) -> str:
    """Guess the input format from the file suffix, or from the folder's contents."""
    if _saved_dataset(path) is not None:
        return "arrow"  # a Hugging Face `save_to_disk` folder
    listing = _files(str(path))
    if not listing.files:
        raise SourceError(f"{path}: no input files")
    suffixes = {os.path.splitext(f)[1].lower() for _, f in listing.files}
    if not listing.single and is_parquet_folder([rel for rel, _ in listing.files]):
        return "parquet"
    if not listing.single and suffixes <= IMAGE_SUFFIXES and all("/" in rel for rel, _ in listing.files):
        return "images"
    for fmt, exts in (("jsonl", {".jsonl", ".json", ".ndjson"}), ("parquet", {".parquet"}),
                      ("csv", {".csv"}), ("tsv", {".tsv"})):
        if suffixes <= exts:
            return fmt
    return "text"


def _line_chunks(path: str, kind: str) -> list[Chunk]:
    """Byte ranges of about LINE_CHUNK, each ending just after a newline (or at end of file)."""
    size = input_size(path)
    chunks, start = [], 0
    with open_input(path, 64 << 10) as f:  # (remote: finding a line end costs a 64 KB GET, not more)
        while start < size:
            f.seek(min(start + LINE_CHUNK, size))
            f.readline()
            stop = min(f.tell(), size) if start + LINE_CHUNK < size else size
            chunks.append(Chunk(kind, path, start, stop))
            start = stop
    return chunks


def plan_chunks(path: str | Path, fmt: str) -> list[Chunk]:
    """Split the input into chunks, in the order their samples appear in the dataset."""
    root = str(path) if is_url(path) else str(Path(path))
    if fmt not in FORMATS:
        raise SourceError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "images":
        files = _image_files(root)
        return [Chunk("images", root, files=tuple(f for f, _ in files[i:i + FILES_PER_CHUNK]),
                      labels=tuple(lab for _, lab in files[i:i + FILES_PER_CHUNK]))
                for i in range(0, len(files), FILES_PER_CHUNK)]
    if fmt == "arrow":
        return [Chunk("arrow", f) for f in _saved_dataset(root) or [f for _, f in _files(root, {".arrow"}).files]]
    files = [f for _, f in _files(root, {".parquet"} if fmt == "parquet" else None).files]
    if fmt == "text":
        return [Chunk("text", root, files=tuple(files[i:i + FILES_PER_CHUNK]))
                for i in range(0, len(files), FILES_PER_CHUNK)]
    if fmt == "parquet":
        return [Chunk("parquet", f, g, g + 1) for f in files for g in range(_parquet(f).num_row_groups)]
    if fmt in ("csv", "tsv"):
        return [Chunk(fmt, f) for f in files]
    return [c for f in files for c in _line_chunks(f, fmt)]


def _saved_dataset(path: str | Path) -> list[str] | None:
    try:
        return saved_dataset_files(path)
    except ValueError as exc:
        raise SourceError(str(exc)) from None


def _image_files(root: str) -> list[tuple[str, int]]:
    """(file, label) of an image folder: one sub-folder per class, labelled in sorted order. In a
    bucket, a class is a first key segment with objects below it (there are no empty folders)."""
    if is_url(root):
        listing = _files(root, IMAGE_SUFFIXES)
        classes = sorted({rel.split("/")[0] for rel, _ in listing.files if "/" in rel})
        grouped = [[f for rel, f in listing.files if rel.startswith(f"{c}/")] for c in classes]
    else:
        folder = Path(root)
        classes = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        grouped = [[f for _, f in _files(str(folder / c), IMAGE_SUFFIXES).files] for c in classes]
    if not classes:
        raise SourceError(f"{root}: an image folder needs one sub-folder per class")
    return [(f, label) for label, found in enumerate(grouped) for f in found]


def _parquet(path: str) -> Any:
    """A ParquetFile over a local file, or over ranged GETs of a bucket object."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(open_unbuffered(path) if is_url(path) else path)


Located = Iterator[tuple[int, dict[str, Any]]]  # (position in the chunk, sample); see `locate`


def _chunk_bytes(chunk: Chunk) -> bytes:
    return read_range(chunk.path, chunk.start, chunk.stop)


def _read_jsonl(chunk: Chunk) -> Located:
    for i, line in enumerate(_chunk_bytes(chunk).splitlines()):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise with_excerpt(SourceError(f"{locate(chunk, i)}: bad JSON: {exc.msg} (column {exc.colno})"),
                               excerpt(exc.doc, exc.colno)) from None
        except UnicodeDecodeError as exc:
            raise SourceError(f"{locate(chunk, i)}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
        except RecursionError:
            raise SourceError(f"{locate(chunk, i)}: JSON nested too deeply to read") from None
        if not isinstance(obj, dict):
            raise SourceError(f"{locate(chunk, i)}: each JSONL line must be an object, got {type(obj).__name__}")
        yield i, obj


def read_row_group(chunk: Chunk) -> Any:
    """A Parquet chunk's row group as an Arrow table."""
    return _parquet(chunk.path).read_row_group(chunk.start)


def _read_arrow(chunk: Chunk) -> Located:
    yield from enumerate(read_arrow_file(chunk.path).to_pylist())


def _read_parquet(chunk: Chunk) -> Located:
    yield from enumerate(read_row_group(chunk).to_pylist())


def _read_csv(chunk: Chunk) -> Located:
    with io.TextIOWrapper(open_input(chunk.path), encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t" if chunk.kind == "tsv" else ",")
        try:
            for row in reader:
                yield reader.line_num, row  # the physical line the record ends on (quoted cells may span lines)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise SourceError(f"{chunk.path}, line {reader.line_num + 1}: {exc}") from None


def _read_lines(chunk: Chunk) -> Located:
    data = _chunk_bytes(chunk)
    try:
        data.decode("utf-8")  # fail before yielding anything, with the exact line of the bad byte
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start)
        raise SourceError(f"{locate(chunk, line)}: not UTF-8 text ({exc.reason})") from None
    for i, line in enumerate(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline=None)):
        text = line.rstrip("\n")
        if text:
            yield i, {"text": text}


def _read_text(chunk: Chunk) -> Located:
    for i, f in enumerate(chunk.files):
        try:  # decoded as Path.read_text does (universal newlines)
            text = io.TextIOWrapper(io.BytesIO(read_all(f)), encoding="utf-8").read()
        except UnicodeDecodeError as exc:
            raise SourceError(f"{f}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        yield i, {"text": text}


def _read_images(chunk: Chunk) -> Located:
    from PIL import Image

    for i, (f, label) in enumerate(zip(chunk.files, chunk.labels, strict=True)):
        data = read_all(f)
        if os.path.splitext(f)[1].lower() in JPEG_SUFFIXES:
            yield i, {"image": data, "label": label}  # the original JPEG bytes, as MDS does
            continue
        try:
            with Image.open(io.BytesIO(data)) as im:
                buf = io.BytesIO()
                im.convert("RGB").save(buf, format="JPEG", quality=75)
        except OSError as exc:
            raise SourceError(f"{f}: cannot read the image: {exc}") from None
        yield i, {"image": buf.getvalue(), "label": label}


READERS = {"jsonl": _read_jsonl, "parquet": _read_parquet, "csv": _read_csv, "tsv": _read_csv,
           "lines": _read_lines, "text": _read_text, "images": _read_images, "arrow": _read_arrow}


def read_chunk(chunk: Chunk) -> Iterator[dict[str, Any]]:
    """The chunk's samples, in order."""
    return (sample for _, sample in READERS[chunk.kind](chunk))


def read_chunk_located(chunk: Chunk) -> Located:
    """The chunk's samples with their positions, so an error can name the input line (`locate`)."""
    return READERS[chunk.kind](chunk)


def _lines_before(path: str, stop: int) -> int:
    """Newlines in the first `stop` bytes of a file (only computed when an error needs a line number)."""
    count = 0
    with open_input(path) as f:
        while stop > 0:
            block = f.read(min(stop, 16 << 20))
            if not block:
                break
            count += block.count(b"\n")
            stop -= len(block)
    return count


def locate(chunk: Chunk, position: int) -> str:
    """Where a sample came from, for error messages: 'file, line N' (1-based), 'file, row N' (0-based,
    Parquet), or the file itself (text files, images)."""
    if chunk.kind in ("jsonl", "lines"):
        return f"{chunk.path}, line {_lines_before(chunk.path, chunk.start) + position + 1}"
    if chunk.kind == "parquet":
        meta = _parquet(chunk.path).metadata
        row = sum(meta.row_group(g).num_rows for g in range(chunk.start)) + position
        return f"{chunk.path}, row {row} (row group {chunk.start})"
    if chunk.kind in ("csv", "tsv"):
        return f"{chunk.path}, line {position}"
    if chunk.kind == "arrow":
        return f"{chunk.path}, row {position}"
    return chunk.files[position]


def infer_encoding(value: Any) -> str:
    """The MDS encoding a value of this Python type naturally takes."""
    if isinstance(value, bool):
        return "uint8"
    if isinstance(value, (int, np.integer)):
        return "int64" if isinstance(value, np.integer) else "int"
    if isinstance(value, (float, np.floating)):
        return "float64"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    if isinstance(value, np.ndarray):
        return f"ndarray:{value.dtype.name}:{','.join(map(str, value.shape))}"
    return "json"


def infer_columns(first: dict[str, Any], fmt: str) -> dict[str, str]:
    """Encodings for each column from the first sample (images: jpeg + int label)."""
    if fmt == "images":
        return {"image": "jpeg", "label": "int"}
    return {name: infer_encoding(value) for name, value in first.items()}


def parse_columns(text: str) -> dict[str, str]:
    """'text:str,label:int' -> {'text': 'str', 'label': 'int'}; errors name the bad item."""
    out: dict[str, str] = {}
    # Split on commas that start a new NAME: so 'tokens:ndarray:uint16:2,3' keeps its shape.
    for item in filter(None, (p.strip() for p in re.split(r",(?=\s*[A-Za-z_][\w.\-]*:)", text))):
        name, sep, enc = item.partition(":")
        if not sep or not name or not enc:
            raise SourceError(f"--columns item {item!r} must be NAME:ENCODING")
        out[name] = enc
    if not out:
        raise SourceError("--columns is empty")
    return out
