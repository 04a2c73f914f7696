"""What `convert` does with one input chunk, in a worker process or in-line: read, encode, hand back bytes.

A worker turns a whole chunk into shard-ready bytes: every sample encoded (by the same `SampleEncoder`
as `ShardWriter.write`) into one contiguous body, plus the per-sample sizes. The parent then only cuts
shards and stores them (`ShardWriter.write_encoded`), so no sample is pickled as Python objects and the
parent stays light. The body crosses over through a file in a tmpfs folder (`/dev/shm`) that the parent
memory-maps and unlinks at once: one copy instead of the four of a pickle through a pipe. Without a
usable tmpfs, or when it is full, the body travels through the pipe instead.

Errors name the input file and line (or row, or file) of the sample that failed, as `SourceError`,
which pickles across processes intact.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

import numpy as np

from tessera.shards.columnar import encode_uniform_rows
from tessera.shards.encodings import Buffer
from tessera.shards.errors import EncodeError
from tessera.shards.samples import SampleEncoder
from tessera.shards.sources import Chunk, SourceError, locate, read_chunk_located, read_row_group
from tessera.storage import StorageError

IOV_MAX = 1024  # buffers per writev (the Linux limit)
_INT = {"int", "str_int", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
_FLOAT = {"str_float", "float16", "float32", "float64"}


@dataclass(frozen=True)
class ChunkJob:
    """One chunk to encode, with everything the worker needs (small and picklable)."""

    index: int
    chunk: Chunk
    columns: tuple[tuple[str, str], ...]
    text_field: str | None = None
    text_cells: bool = False  # CSV/TSV: parse cells into the type their column's encoding expects
    handover: str | None = None  # tmpfs folder for the body; None: return it in the result


@dataclass
class EncodedChunk:
    """A chunk's samples as shard-ready bytes: `sizes[i]` bytes each, concatenated in the body, which is
    either `body` or the file `path` (`open_body` gets it either way)."""

    index: int
    sizes: np.ndarray  # uint32, one per sample
    nbytes: int
    body: Buffer | None = None
    path: str | None = None
    columnar: bool = False  # encoded column-wise (see `columnar.py`): a slice of the input, no per-row work


def coerce(sample: dict[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    """CSV/TSV cells are text: parse them into the type their column's encoding expects."""
    out = dict(sample)
    for name, enc in columns.items():
        value = out.get(name)
        if not isinstance(value, str):
            continue
        try:
            if enc in _INT:
                out[name] = int(value)
            elif enc in _FLOAT:
                out[name] = float(value)
            elif enc == "str_decimal":
                out[name] = Decimal(value)
            elif enc == "json":
                out[name] = json.loads(value)
        except (ValueError, ArithmeticError) as exc:
            raise SourceError(f"column {name!r} ({enc}): cannot parse {value!r}: {exc}") from None
    return out


def select(sample: dict[str, Any], text_field: str | None) -> dict[str, Any]:
    """`--text-field`: keep one field of each sample, as the column `text`."""
    if text_field is None:
        return sample
    if text_field not in sample:
        raise SourceError(f"no field {text_field!r} in a sample with fields {sorted(sample)}")
    return {"text": sample[text_field]}


@lru_cache(maxsize=4)
def _encoder(columns: tuple[tuple[str, str], ...]) -> SampleEncoder:
    return SampleEncoder(dict(columns), "convert")


def encode_chunk(job: ChunkJob) -> EncodedChunk:
    """Read and encode every sample of one chunk (runs in a worker process, or in-line for one worker)."""
    encoder = _encoder(job.columns)
    encode, columns = encoder.encode, dict(job.columns)
    pieces: list[Any] = []  # every sample's parts, joined once (no growing buffer)
    sizes = array("I")
    try:
        rows = read_chunk_located(job.chunk)
        if job.chunk.kind == "parquet" and job.text_field is None:
            table = read_row_group(job.chunk)
            uniform = encode_uniform_rows(table, encoder)
            if uniform is not None:
                result = _result(job, uniform[0], [uniform[1]])
                result.columnar = True
                return result
            rows = enumerate(table.to_pylist())
        for position, sample in rows:  # readers name the place of their errors
            try:
                sample = select(sample, job.text_field)
                parts, size = encode(coerce(sample, columns) if job.text_cells else sample)
            except (EncodeError, SourceError) as err:
                raise SourceError(f"{locate(job.chunk, position)}: {err}") from None
            pieces += parts
            sizes.append(size)
    except SourceError:
        raise
    except (OSError, ValueError, StorageError) as err:  # an unreadable file or object, Arrow's errors
        raise SourceError(f"{job.chunk.path}: {type(err).__name__}: {err}") from None
    return _result(job, np.frombuffer(sizes, dtype=np.uint32), pieces)


def _result(job: ChunkJob, sizes: np.ndarray, pieces: list[Any]) -> EncodedChunk:
    result = EncodedChunk(job.index, sizes, int(sizes.sum(dtype=np.int64)))
    result.path = _hand_over(job, pieces)
    if result.path is None:
        result.body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return result


def _hand_over(job: ChunkJob, pieces: list[Any]) -> str | None:
    """Write the pieces into a file of the tmpfs folder with gathered writes (the one copy of the body);
    None when there is no such folder or it is full: the body then goes through the pipe."""
    if job.handover is None or not pieces:
        return None
    path = os.path.join(job.handover, f"chunk-{job.index:08d}.bin")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for i in range(0, len(pieces), IOV_MAX):
                _write_all(fd, pieces[i:i + IOV_MAX])
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return path


def _write_all(fd: int, pieces: list[Any]) -> None:
    """`os.writev` until every byte is written (a write may be partial)."""
    views = [piece if type(piece) is bytes else memoryview(piece).cast("B") for piece in pieces]
    views = [view for view in views if len(view)]  # len() counts bytes: bytes, or views cast to "B"
    first = 0
    while first < len(views):
        done = os.writev(fd, views[first:])
        while first < len(views) and done >= len(views[first]):
            done -= len(views[first])
            first += 1
        if done:
            views[first] = views[first][done:]


def open_body(result: EncodedChunk) -> Buffer | mmap.mmap:
    """The chunk's body in the parent: the tmpfs file memory-mapped (and unlinked: the mapping keeps the
    pages until the last shard slicing it is stored), or the bytes that came through the pipe."""
    if result.path is None:
        return result.body if result.body is not None else b""
    try:
        with open(result.path, "rb") as file:  # populate: map every page now, not one fault at a time
            body = mmap.mmap(file.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                             prot=mmap.PROT_READ)
    finally:
        os.unlink(result.path)
    if len(body) != result.nbytes:
        raise SourceError(f"{result.path}: handover file has {len(body)} bytes, expected {result.nbytes}")
    return body
