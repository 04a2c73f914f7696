"""`convert`: any input (JSONL, Parquet, CSV/TSV, text, image folders, Python iterables) to one MDS dataset.

Reading and parsing spread over N processes, chunk by chunk (chunks depend only on the input, see
`sources.py`); the writer consumes chunks strictly in order and compresses, hashes and uploads shards in
background threads. The dataset is therefore byte-identical whatever N is, and one index is committed
at the end.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from tessera.shards.sources import Chunk, SourceError, detect_format, infer_columns, plan_chunks, read_chunk
from tessera.shards.writer import ShardWriter

Progress = Callable[[int, int], None]  # (samples written so far, input chunks done)


@dataclass
class ConvertSummary:
    """What a conversion produced, for the CLI's closing table and `--json`."""

    out: str
    format: str
    columns: dict[str, str]
    samples: int = 0
    shards: int = 0
    raw_bytes: int = 0
    stored_bytes: int = 0
    seconds: float = 0.0
    workers: int = 1
    skipped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def mb_per_second(self) -> float:
        return self.raw_bytes / 1e6 / self.seconds if self.seconds else 0.0


def _chunk_samples(chunk: Chunk) -> list[dict[str, Any]]:
    return list(read_chunk(chunk))


def _ordered_samples(chunks: list[Chunk], workers: int) -> Iterator[list[dict[str, Any]]]:
    """Each chunk's samples, in chunk order, read by `workers` processes (a few chunks in flight)."""
    if workers <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            yield _chunk_samples(chunk)
        return
    ctx = mp.get_context("spawn")  # fork after threads (the uploader) is unsafe
    with ctx.Pool(workers) as pool:
        yield from pool.imap(_chunk_samples, chunks, chunksize=1)


_INT = {"int", "str_int", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
_FLOAT = {"str_float", "float16", "float32", "float64"}


def _coerce(sample: dict[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
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


def _select(sample: dict[str, Any], text_field: str | None) -> dict[str, Any]:
    if text_field is None:
        return sample
    if text_field not in sample:
        raise SourceError(f"no field {text_field!r} in a sample with fields {sorted(sample)}")
    return {"text": sample[text_field]}


def convert(input: str | Path, out: str | Path, *, fmt: str | None = None, columns: Mapping[str, str] | None = None,
            compression: str | None = None, hashes: Iterable[str] | None = None,
            size_limit: int | str | None = "64mb", workers: int = 1, mode: str = "create",
            text_field: str | None = None, progress: Progress | None = None) -> ConvertSummary:
    """Convert a file or folder to an MDS dataset at `out` (a folder or any storage URL)."""
    path = Path(input)
    fmt = fmt or detect_format(path)
    chunks = plan_chunks(path, fmt)
    if not chunks:
        raise SourceError(f"{path}: nothing to convert")
    first_chunk = next((c for c in chunks if c), chunks[0])
    first = next(iter(read_chunk(first_chunk)), None)
    if first is None and columns is None:
        raise SourceError(f"{path}: the first chunk has no samples to infer columns from; pass --columns")
    cols = dict(columns) if columns else infer_columns(_select(first, text_field), fmt)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    summary = ConvertSummary(str(out), fmt, cols, workers=workers)
    text_cells = fmt in ("csv", "tsv")
    with ShardWriter(out, cols, compression=compression, hashes=hashes, size_limit=size_limit, mode=mode) as w:
        skip = w.resumed_samples
        for done, samples in enumerate(_ordered_samples(chunks, workers), 1):
            for sample in samples:
                if skip:
                    skip -= 1
                    summary.skipped += 1
                    continue
                sample = _select(sample, text_field)
                w.write(_coerce(sample, cols) if text_cells else sample)
            if progress:
                progress(w.samples_written, done)
        entries = w.finish()
    summary.seconds = time.perf_counter() - t0
    summary.samples = sum(e.samples for e in entries)
    summary.shards = len(entries)
    summary.raw_bytes = sum(e.raw_data.bytes for e in entries)
    summary.stored_bytes = sum(e.stored.bytes for e in entries)
    return summary


def write_samples(samples: Iterable[Mapping[str, Any]], out: str | Path, columns: Mapping[str, str],
                  **writer_options: Any) -> int:
    """Write any Python iterable of sample dicts; returns the sample count."""
    with ShardWriter(out, columns, **writer_options) as w:
        for sample in samples:
            w.write(sample)
        return w.samples_written
