"""`convert` on Ray: the same chunk plan, written as whole parts by Ray tasks, merged into one index.

The input is planned exactly as for one machine (`sources.plan_chunks`: chunks that depend only on the
input). Consecutive chunks are grouped into *parts* (`plan_parts`, again a function of the input alone),
and each part is one Ray task: it reads its chunks straight from where the input lives (a local path
every node sees, or a bucket), encodes them with the same code as a local worker (`encode_chunk`), and
writes its shards with a `ShardWriter` into its own folder `OUT/part-NNNNN/`, committing that folder's
index.json last. Once every part is committed the driver merges the parts' indexes, in part order, into
`OUT/index.json` (`merge.merge_parts`) and writes it last: a driver killed before that leaves no index.

Guarantees, and why:
- Sample order is the input order, whatever the number of workers or nodes: chunks are in input order,
  parts are runs of consecutive chunks, a task writes its chunks in order, and the merged index lists
  the parts in part order.
- Shard boundaries follow the parts, not the workers: each part starts a new shard, so the last shard of
  a part may be smaller than the size limit. They equal a local `convert` when the input is one part, and
  are the same for every run and every cluster size otherwise.
- A task whose worker dies is retried by Ray. A part is written in `overwrite` mode into its own folder:
  its index.json names only the shards of the attempt that committed it, and files of a killed attempt
  are either replaced or never named, so no sample is read twice or lost.
- `mode="resume"` keeps every part whose index.json is committed (with the same columns) and redoes the
  others, then merges.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.shards.convert import ConvertSummary, _infer
from tessera.shards.convert_worker import ChunkJob, encode_chunk, open_body
from tessera.shards.dataset import open_dataset_store, read_index
from tessera.shards.errors import DatasetExists, ShardError
from tessera.shards.index import INDEX_BASENAME, DatasetIndex
from tessera.shards.inputs import is_url
from tessera.shards.merge import merge_parts
from tessera.shards.session import JOURNAL_BASENAME, shard_keys
from tessera.shards.sources import Chunk, SourceError, detect_format, plan_chunks
from tessera.shards.writer import ShardWriter
from tessera.storage import Store

PART_PREFIX = "part-"
MIN_PARTS = 16  # inputs of many chunks are split into at least this many parts (work for every worker)
MAX_CHUNKS_PER_PART = 256  # ~1 GB of JSONL per task: a retried task redoes at most that much
TASK_RETRIES = 3  # Ray retries a task this often when its worker or node dies
RAY_MODES = ("create", "resume", "overwrite")
Progress = Callable[[int, int], None]  # (samples written so far, parts done)


def plan_parts(chunks: list[Chunk], chunks_per_part: int | None = None) -> list[list[Chunk]]:
    """Runs of consecutive chunks, one per Ray task; the split depends on the chunk count only."""
    per = chunks_per_part or min(MAX_CHUNKS_PER_PART, max(1, len(chunks) // MIN_PARTS))
    return [chunks[i:i + per] for i in range(0, len(chunks), per)]


def part_name(index: int) -> str:
    return f"{PART_PREFIX}{index:05d}"


@dataclass(frozen=True)
class PartJob:
    """One part to write (small and picklable: sent to a Ray task)."""

    index: int
    chunks: tuple[Chunk, ...]
    out: str
    columns: tuple[tuple[str, str], ...]
    text_field: str | None = None
    text_cells: bool = False
    compression: str | None = None
    hashes: tuple[str, ...] | None = None
    size_limit: int | str | None = "64mb"


@dataclass(frozen=True)
class PartResult:
    index: int
    samples: int
    shards: int


def write_part(job: PartJob) -> PartResult:
    """Write one part's shards and commit its index.json (runs in a Ray task)."""
    store = open_dataset_store(job.out).child(part_name(job.index))
    with ShardWriter(store, dict(job.columns), compression=job.compression, hashes=job.hashes,
                     size_limit=job.size_limit, mode="overwrite") as writer:
        for i, chunk in enumerate(job.chunks):
            result = encode_chunk(ChunkJob(i, chunk, job.columns, job.text_field, job.text_cells))
            writer.write_encoded(result.sizes, open_body(result))
        entries = writer.finish()
    return PartResult(job.index, sum(e.samples for e in entries), len(entries))


def write_rows_to_part(out: str, index: int, columns: Mapping[str, str], rows: Iterable[Mapping[str, Any]],
                       **options: Any) -> int:
    """Write `rows` as part `index` of `out` (its own folder, `overwrite` mode, its index.json committed
    last) with `ShardWriter` `options`; returns the samples written. For Ray Data's and Spark's writers."""
    store = open_dataset_store(out).child(part_name(index))
    with ShardWriter(store, dict(columns), mode="overwrite", **options) as writer:
        for row in rows:
            writer.write(row)
        return writer.samples_written


def committed_part(store: Store, name: str, columns: Mapping[str, str]) -> DatasetIndex | None:
    """A part's committed index when it holds exactly `columns` (a resume keeps it), else None."""
    part = store.child(name)
    try:
        index = read_index(part)
    except (ShardError, ValueError):
        return None
    if part.exists(JOURNAL_BASENAME):
        return None
    wanted = dict(columns)
    if any(dict(zip(e.column_names, e.column_encodings, strict=True)) != wanted for e in index.shards):
        return None
    return index


def existing_parts(store: Store) -> list[str]:
    """Names of the part folders the store holds (committed or not)."""
    names = {info.key.split("/", 1)[0] for info in store.list(PART_PREFIX)}
    return sorted(n for n in names if n.startswith(PART_PREFIX) and n[len(PART_PREFIX):].isdigit())


def check_target(store: Store, mode: str) -> None:
    """Refuse to write over a dataset or an interrupted distributed write unless the mode says so."""
    if mode not in RAY_MODES:
        raise ValueError(f"a distributed write supports mode {', '.join(RAY_MODES)}, got {mode!r}")
    if mode != "create":
        return
    if store.exists(INDEX_BASENAME) or store.exists(JOURNAL_BASENAME):
        raise DatasetExists(f"{store.url} already holds a dataset; pass mode='overwrite' to replace it")
    if existing_parts(store):
        raise DatasetExists(f"{store.url} holds part folders without a merged index.json (an interrupted "
                            "distributed write); pass mode='resume' to finish it or mode='overwrite' to replace it")


def commit_parts(store: Store, names: list[str]) -> DatasetIndex:
    """Merge the parts' indexes, in the order given, into index.json (written last), then delete what
    the previous dataset held and the new one does not name (older part folders, a replaced dataset)."""
    old: set[str] = set()
    with contextlib.suppress(ShardError, ValueError):
        old = {key for entry in read_index(store).shards for key in shard_keys(entry)}
    stale_parts = [n for n in existing_parts(store) if n not in set(names)]
    merged = merge_parts([store.url_for(name) for name in names], store.url)
    kept = {key for entry in merged.shards for key in shard_keys(entry)}
    doomed = [key for key in old if key not in kept]
    doomed += [info.key for name in stale_parts for info in store.list(name + "/")]
    if doomed:
        store.delete_many(doomed)
    return merged


def _ray_error(exc: BaseException) -> BaseException:
    """The error a task raised (a `SourceError` naming the input line), not Ray's wrapper."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


@contextlib.contextmanager
def ray_session(address: str | None, workers: int) -> Iterator[Any]:
    """Connect to the Ray cluster at `address`, or start a local instance of `workers` CPUs (stopped
    on the way out). A Ray already initialised by the caller is used as it is."""
    try:
        import ray
    except ImportError:
        raise ValueError("--engine ray needs Ray: pip install 'tessera[ray]' (or 'ray[data]')") from None

    if ray.is_initialized():
        yield ray
        return
    import logging

    # log_to_driver=False: workers' log lines (a retried task's death notice) stay out of `--json` output
    options: dict[str, Any] = {"logging_level": logging.WARNING, "include_dashboard": False, "log_to_driver": False}
    if address is None:  # "local": a new instance even when `ray start` runs one on this machine
        ray.init(address="local", num_cpus=workers, **options)
    else:
        ray.init(address=address, **options)
    try:
        yield ray
    finally:
        ray.shutdown()


def ordered_map_on_ray(fn: Callable[[Any], Any], items: list[Any], workers: int,
                       address: str | None = None) -> Iterator[Any]:
    """`fn` over `items` as Ray tasks, `workers` at a time (plus as many queued), results in item order.

    For work whose results the driver must consume in order (`tessera llm prep` numbers documents
    globally): the output is then the same as with local processes. A task whose worker dies is retried."""
    with ray_session(address, workers) as ray:
        task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(fn)
        following = iter(items)
        pending = [task.remote(item) for item in itertools.islice(following, 2 * workers)]
        while pending:
            try:
                result = ray.get(pending.pop(0))
            except Exception as exc:
                for ref in pending:
                    ray.cancel(ref)
                raise _ray_error(exc) from None
            pending.extend(task.remote(item) for item in itertools.islice(following, 1))
            yield result


def convert_on_ray(input: str | Path, out: str | Path, *, fmt: str | None = None,
                   columns: Mapping[str, str] | None = None, compression: str | None = None,
                   hashes: Iterable[str] | None = None, size_limit: int | str | None = "64mb", workers: int = 1,
                   mode: str = "create", text_field: str | None = None, address: str | None = None,
                   chunks_per_part: int | None = None, progress: Progress | None = None) -> ConvertSummary:
    """Convert a file, folder or bucket prefix to an MDS dataset with Ray tasks, `workers` at a time.

    `address` names a running cluster (`ray start --head`); None starts a local instance of `workers`
    CPUs for this call. Every node must read the input and write `out` (a bucket, or a shared folder)."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    t0 = time.perf_counter()
    path = str(input) if is_url(input) else Path(input).resolve()  # workers do not share our working directory
    if str(path).startswith("memory://") or str(out).startswith("memory://"):
        raise ValueError("memory:// stores live in one process; Ray tasks run in others")
    fmt = fmt or detect_format(path)
    store = open_dataset_store(str(out) if is_url(out) else str(Path(out).resolve()))
    check_target(store, mode)
    chunks = plan_chunks(path, fmt)
    if not chunks:
        raise SourceError(f"{path}: nothing to convert")
    cols = dict(columns) if columns else _infer(chunks, fmt, text_field, path)
    parts = plan_parts(chunks, chunks_per_part)
    spec = tuple(sorted(cols.items()))
    jobs = [PartJob(i, tuple(part), store.url, spec, text_field, fmt in ("csv", "tsv"), compression,
                    tuple(hashes) if hashes else None, size_limit) for i, part in enumerate(parts)]
    kept = {}
    if mode == "resume":
        kept = {job.index: found for job in jobs
                if (found := committed_part(store, part_name(job.index), cols)) is not None}
    summary = ConvertSummary(store.url, fmt, cols, workers=workers, extra={"engine": "ray", "parts": len(parts),
                                                                          "parts_kept": len(kept)})
    samples = sum(index.num_samples for index in kept.values())
    todo = [job for job in jobs if job.index not in kept]
    with ray_session(address, workers) as ray:
        task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(write_part)
        running: dict[Any, PartJob] = {}
        done = len(kept)
        while todo or running:
            while todo and len(running) < workers:
                job = todo.pop(0)
                running[task.remote(job)] = job
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                running.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:
                    for other in running:
                        ray.cancel(other)
                    raise _ray_error(exc) from None
                samples += result.samples
                done += 1
                if progress:
                    progress(samples, done)
    merged = commit_parts(store, [part_name(job.index) for job in jobs])
    summary.skipped = sum(index.num_samples for index in kept.values())
    return summary.written(merged.shards, t0)
