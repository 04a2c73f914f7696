"""`convert`: any input (JSONL, Parquet, CSV/TSV, text, image folders) to one MDS dataset, in N processes.

The input is split into chunks that depend only on the input (see `sources.py`). Each worker reads a
whole chunk and encodes it into shard-ready bytes (`convert_worker.py`); the parent takes the chunks
strictly in order and cuts shards from those bytes exactly where one `ShardWriter.write` per sample would
(`ShardWriter.write_encoded`), while background threads compress, hash and upload them and one index is
committed at the end. The dataset is therefore byte-identical whatever N is, and the parent does little
more than slice buffers, so N processes scale until compression or storage is the limit.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tessera.shards.convert_worker import ChunkJob, EncodedChunk, encode_chunk, open_body, select
from tessera.shards.dataset import open_dataset_store
from tessera.shards.index import ShardEntry
from tessera.shards.inputs import is_url
from tessera.shards.pool import spawn_without_main, start_method
from tessera.shards.provenance import NotResumable, Segment, input_ids, merge_segments
from tessera.shards.resume import check_resume
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
    status: str = "written"  # "complete": a resume found it done; "committed": it finished the commit
    extra: dict[str, Any] = field(default_factory=dict)

    def written(self, entries: Sequence[ShardEntry], started: float) -> ConvertSummary:
        """Count the shards written (`entries`) and the seconds since `started` (perf_counter)."""
        self.seconds = time.perf_counter() - started
        self.samples = sum(e.samples for e in entries)
        self.shards = len(entries)
        self.raw_bytes = sum(e.raw_data.bytes for e in entries)
        self.stored_bytes = sum(e.stored.bytes for e in entries)
        return self

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def mb_per_second(self) -> float:
        return self.raw_bytes / 1e6 / self.seconds if self.seconds else 0.0


HANDOVER_ROOT = "/dev/shm"  # tmpfs: chunk bodies cross from workers to the parent here, not through pipes
IN_FLIGHT_PER_WORKER = 2  # chunks queued or encoded ahead of the writer, per worker (bounds memory)


def _warm_up(fmt: str) -> None:
    """First task of each worker: the imports happen while the parent plans the input."""
    import tessera.shards.convert_worker  # noqa: F401

    if fmt == "parquet":
        import pyarrow.parquet  # noqa: F401


class ChunkPool:
    """N worker processes encoding chunks; results come in chunk order, with a bounded look-ahead.

    The parent encodes the first chunk itself, as well as any it needs before every worker is up (see
    `start_method`). When that first chunk was encoded column-wise (uniform Parquet rows: the body is
    a slice of what Arrow read), the parent keeps encoding in-line and lets the workers go: a hop
    between processes would cost a copy of every byte and save nothing."""

    def __init__(self, workers: int, fmt: str) -> None:
        self.workers = workers
        self.in_line = False
        self._may_go_in_line = fmt == "parquet"  # only Parquet chunks can be encoded column-wise
        self.handover = _handover_dir()
        method = start_method()
        if method == "fork":
            _warm_up(fmt)  # import once, before forking, rather than in every child
        self._pool = ProcessPoolExecutor(workers, mp_context=mp.get_context(method))
        with spawn_without_main():
            self._starting = [self._pool.submit(_warm_up, fmt) for _ in range(workers)]  # starts them now

    def _started(self) -> bool:
        if self._starting and all(future.done() for future in self._starting):
            for future in self._starting:
                future.result()  # a worker that failed to start raises here
            self._starting = []
        return not self._starting

    def encode(self, jobs: list[ChunkJob]) -> Iterator[EncodedChunk]:
        futures: dict[int, Future[EncodedChunk]] = {}
        submitted = 0  # jobs before this one are submitted or were encoded in-line
        ahead = self.workers * IN_FLIGHT_PER_WORKER
        for i, job in enumerate(jobs):
            if self.in_line:
                yield encode_chunk(job)
                continue
            if (i > 0 or not self._may_go_in_line) and self._started():
                while submitted < len(jobs) and submitted - i < ahead:
                    queued = jobs[submitted]
                    futures[submitted] = self._pool.submit(encode_chunk, replace(queued, handover=self.handover))
                    submitted += 1
            if i in futures:
                yield futures.pop(i).result()
            else:
                submitted = i + 1
                result = encode_chunk(job)
                if i == 0 and result.columnar:
                    self.in_line = True
                    self.close(wait=False)
                yield result

    def close(self, wait: bool = True) -> None:
        """Stop the workers; `wait=False` once every chunk is taken (they have nothing left to write)."""
        self._pool.shutdown(wait=wait, cancel_futures=True)
        if self.handover is not None:
            shutil.rmtree(self.handover, ignore_errors=True)  # bodies of chunks never taken (errors)


def _handover_dir() -> str | None:
    """A fresh tmpfs folder named after this process; those of conversions whose process is gone (killed
    before `close` removed them) are removed first, so a crash does not keep their bodies in memory."""
    _remove_orphaned_handovers()
    try:
        return tempfile.mkdtemp(prefix=f"tessera-convert-{os.getpid()}-", dir=HANDOVER_ROOT)
    except OSError:  # no tmpfs here: bodies go through the pipe
        return None


def _remove_orphaned_handovers() -> None:
    if not Path("/proc/self").exists():  # cannot tell live processes from dead ones: leave them
        return
    for folder in Path(HANDOVER_ROOT).glob("tessera-convert-*-*"):
        pid = folder.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def _skip(sizes: np.ndarray, body: Any, count: int) -> tuple[np.ndarray, Any]:
    """Drop the first `count` samples (kept by the interrupted write that `mode="resume"` continues)."""
    start = int(sizes[:count].sum(dtype=np.int64))
    return sizes[count:], memoryview(body)[start:]


def convert(input: str | Path, out: str | Path, *, fmt: str | None = None, columns: Mapping[str, str] | None = None,
            compression: str | None = None, hashes: Iterable[str] | None = None,
            size_limit: int | str | None = "64mb", workers: int = 1, mode: str = "create",
            text_field: str | None = None, progress: Progress | None = None) -> ConvertSummary:
    """Convert a file or folder to an MDS dataset at `out` (a folder or any storage URL).

    `workers` processes read and encode the input; the dataset is byte-identical for any `workers`.
    `mode="resume"` stores each input row exactly once however often the conversion was interrupted or
    resumed (resume.py): a complete conversion is left as it is (`status` "complete")."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    t0 = time.perf_counter()
    path = str(input) if is_url(input) else Path(input)  # a bucket URL stays a URL (inputs.py)
    if workers > 1 and str(path).startswith("memory://"):
        raise ValueError(f"{path}: a memory:// input lives in this process only; convert it with workers=1")
    fmt = fmt or detect_format(path)
    with contextlib.ExitStack() as stack:
        pool = None
        if workers > 1:
            pool = ChunkPool(workers, fmt)
            stack.callback(pool.close)
        store = open_dataset_store(out)
        chunks = plan_chunks(path, fmt)
        if not chunks:
            raise SourceError(f"{path}: nothing to convert")
        inputs, chunk_input = input_ids(str(path), chunks)
        finished = check_resume(store, inputs) if mode == "resume" else None
        if finished is not None:
            first = finished.index.shards[0] if finished.index.shards else None
            cols = dict(zip(first.column_names, first.column_encodings, strict=True)) if first else {}
            summary = ConvertSummary(str(out), fmt, cols, workers=workers, status=finished.how)
            return summary.written(finished.index.shards, t0)
        cols = dict(columns) if columns else _infer(chunks, fmt, text_field, path)
        if pool is not None and len(chunks) == 1:
            pool.close()  # one chunk: nothing to spread
            pool = None
        summary = ConvertSummary(str(out), fmt, cols, workers=workers)
        spec = tuple(sorted(cols.items()))
        jobs = [ChunkJob(i, chunk, spec, text_field, fmt in ("csv", "tsv")) for i, chunk in enumerate(chunks)]
        with ShardWriter(store, cols, compression=compression, hashes=hashes, size_limit=size_limit, mode=mode,
                         sources=inputs) as w:
            encoded = pool.encode(jobs) if pool is not None else map(encode_chunk, jobs)
            _write_chunks(w, encoded, chunk_input, summary, progress)
            if pool is not None:
                pool.close(wait=False)  # the workers exit while the last shards are stored
            entries = w.finish()
    return summary.written(entries, t0)


def _write_chunks(w: ShardWriter, encoded: Iterable[EncodedChunk], chunk_input: list[int],
                  summary: ConvertSummary, progress: Progress | None) -> None:
    """Hand the encoded chunks to the writer in order, each with the input rows it holds; the first
    `w.resumed_samples` samples (stored by the interrupted write a resume continues) are dropped, and
    the rows they were are checked against (or recorded as) the provenance of the shards that hold them."""
    skip = w.resumed_samples
    rows = [0] * (max(chunk_input) + 1)  # rows of each input read so far
    kept: list[Segment] = []  # the input rows the resumed shards hold
    checked = False
    for done, result in enumerate(encoded, 1):
        sizes, body = result.sizes, open_body(result)
        source = chunk_input[result.index]
        first, rows[source] = rows[source], rows[source] + len(sizes)
        if skip:
            dropped = min(skip, len(sizes))
            kept.append((source, first, first + dropped))
            sizes, body = _skip(sizes, body, dropped)
            skip -= dropped
            first += dropped
            summary.skipped += dropped
        if not skip and not checked:
            w.check_resumed(merge_segments(kept))
            checked = True
        w.write_encoded(sizes, body, (source, first))
        if progress:
            progress(w.samples_written, done)
    if skip:
        raise NotResumable(f"{w.store.url}: the interrupted write stored {w.resumed_samples:,} samples, but this "
                           f"input has only {w.resumed_samples - skip:,}: it is not the input that write was "
                           "converting; resume with the same input, or pass mode='overwrite' to start over")


def _infer(chunks: list[Chunk], fmt: str, text_field: str | None, path: str | Path) -> dict[str, str]:
    """Column encodings from the first sample of the input."""
    first_chunk = next((c for c in chunks if c), chunks[0])
    first = next(iter(read_chunk(first_chunk)), None)
    if first is None:
        raise SourceError(f"{path}: the first chunk has no samples to infer columns from; pass --columns")
    return infer_columns(select(first, text_field), fmt)


def write_samples(samples: Iterable[Mapping[str, Any]], out: str | Path, columns: Mapping[str, str],
                  **writer_options: Any) -> int:
    """Write any Python iterable of sample dicts; returns the sample count."""
    with ShardWriter(out, columns, **writer_options) as w:
        for sample in samples:
            w.write(sample)
        return w.samples_written
