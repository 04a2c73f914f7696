"""Data prep: text corpora to fixed-length token windows in MDS, written straight to a folder or bucket.

    prep("corpus/", "s3://bucket/data", tokenizer="tok.json", seq_len=2048, workers=4)

gives `OUT/train/` and `OUT/val/`, two MDS datasets with one column, `tokens` (`ndarray:uint16:L`, or
uint32 when the vocabulary has more than 65536 tokens).

How, and why the output does not depend on `workers`:
1. The input is split into chunks that depend only on the input (`corpus.plan_corpus`: groups of text
   files, byte ranges of JSONL snapped to line ends, Parquet row groups).
2. Worker processes tokenize whole chunks (one document per text file, JSONL line or Parquet row) and
   return each chunk's tokens, with EOS appended after every document, plus the document lengths.
3. The main process consumes chunks strictly in input order, numbers documents globally, sends each to
   val or train by a hash of its number (`is_validation`), concatenates each split's tokens and cuts
   them into windows of `seq_len`. The trailing tokens that do not fill a window are dropped.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import xxhash

from tessera.llm.corpus import plan_corpus, read_documents
from tessera.llm.tokenizer import Tokenizer, load_tokenizer
from tessera.shards.dataset import open_dataset_store
from tessera.shards.sources import Chunk, SourceError
from tessera.shards.writer import ShardWriter

SPLITS = ("train", "val")
ENCODE_BATCH = 256  # documents per encode_batch call
Progress = Callable[["PrepSummary", int, int], None]  # (summary so far, chunks done, chunks in total)
T = TypeVar("T")
R = TypeVar("R")


@dataclass
class PrepSummary:
    out: str
    tokenizer: str
    vocab_size: int
    seq_len: int
    dtype: str
    workers: int
    documents: int = 0
    skipped_files: int = 0  # text files that are not UTF-8
    tokens: int = 0  # tokens read, EOS included
    windows: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    documents_per_split: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    dropped_tokens: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every token id fits (vocab_size <= 65536), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def is_validation(doc_index: int, val_fraction: float, seed: int = 0) -> bool:
    """Whether document `doc_index` (0-based, input order) belongs to the validation split.

    A hash of the index, not a random draw: the same documents are held out on every run, whatever
    the number of processes, and adding documents at the end never moves earlier ones.
    """
    if val_fraction <= 0:
        return False
    return xxhash.xxh64_intdigest(doc_index.to_bytes(8, "little"), seed) < val_fraction * 2.0 ** 64


# --- worker side: one tokenizer per process ------------------------------------------------------------

_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer_path: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = load_tokenizer(tokenizer_path)


def _start_worker(init: Callable[[Any], None], argument: Any, threads: bool) -> None:
    if not threads:  # N processes x M Rust threads would oversubscribe the cores
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    init(argument)


def map_in_order(task: Callable[[T], R], tasks: list[T], init: Callable[[Any], None], argument: Any,
                 workers: int) -> Iterator[R]:
    """`task` over `tasks`, results in task order whatever the number of processes; each process first
    runs `init(argument)` (loads its tokenizer). One process (no pool) when there is one worker or task."""
    if workers <= 1 or len(tasks) <= 1:
        _start_worker(init, argument, threads=True)
        yield from map(task, tasks)
        return
    ctx = mp.get_context("spawn")  # fork after threads (the shard uploader) is unsafe
    with ctx.Pool(workers, initializer=_start_worker, initargs=(init, argument, False)) as pool:
        yield from pool.imap(task, tasks, chunksize=1)
        pool.close()  # let the workers exit on their own; the context's terminate() is for errors
        pool.join()


def tokenize_chunk(chunk: Chunk, text_field: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(tokens of every document of the chunk, each followed by EOS, as uint32; document lengths;
    files skipped as not UTF-8)."""
    tok = _worker_tokenizer
    assert tok is not None, "call _init_worker first"
    text = read_documents(chunk, text_field)
    parts: list[np.ndarray] = []
    lengths: list[int] = []
    eos = np.array([tok.eos_id], dtype=np.uint32)
    for i in range(0, len(text.documents), ENCODE_BATCH):
        for ids in tok.encode_batch(text.documents[i:i + ENCODE_BATCH]):
            parts += [np.asarray(ids, dtype=np.uint32), eos]
            lengths.append(len(ids) + 1)
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
    return tokens, np.asarray(lengths, dtype=np.int64), text.skipped


def _tokenize_task(args: tuple[Chunk, str]) -> tuple[np.ndarray, np.ndarray, int]:
    return tokenize_chunk(*args)


_worker_tokenizer_path: str | None = None


def _ray_tokenize_task(args: tuple[Chunk, str, str]) -> tuple[np.ndarray, np.ndarray, int]:
    """A Ray task: loads the tokenizer once per worker process, then tokenizes one chunk."""
    global _worker_tokenizer_path
    chunk, text_field, tokenizer_path = args
    if _worker_tokenizer is None or _worker_tokenizer_path != tokenizer_path:
        _start_worker(_init_worker, tokenizer_path, threads=False)
        _worker_tokenizer_path = tokenizer_path
    return tokenize_chunk(chunk, text_field)


def _tokenized_chunks(chunks: list[Chunk], text_field: str, tokenizer_path: str, workers: int,
                      engine: str = "local", address: str | None = None
                      ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """Each chunk's tokens, in chunk order, whatever the number of processes, or of Ray workers
    (`engine="ray"`: chunks are tokenized by Ray tasks, which need the input and the tokenizer file at
    the same paths; this process still numbers documents and cuts windows, so the output is the same)."""
    if engine == "ray":
        from tessera.shards.ray_engine import ordered_map_on_ray

        return ordered_map_on_ray(_ray_tokenize_task, [(c, text_field, tokenizer_path) for c in chunks], workers,
                                  address)
    return map_in_order(_tokenize_task, [(c, text_field) for c in chunks], _init_worker, tokenizer_path, workers)


# --- main side: split, concatenate, cut, write --------------------------------------------------------


class WindowWriter:
    """Concatenates token runs and writes every full window of `seq_len` as one sample."""

    def __init__(self, writer: ShardWriter, seq_len: int, dtype: np.dtype) -> None:
        self.writer, self.seq_len, self.dtype = writer, seq_len, dtype
        self.pending = np.zeros(0, dtype)
        self.windows = 0

    def add(self, runs: list[np.ndarray]) -> None:
        if not runs:
            return
        buf = np.concatenate([self.pending, *(r.astype(self.dtype, copy=False) for r in runs)])
        full = len(buf) // self.seq_len
        for i in range(full):
            self.writer.write({"tokens": buf[i * self.seq_len:(i + 1) * self.seq_len]})
        self.windows += full
        self.pending = buf[full * self.seq_len:]


def check_prep_options(seq_len: int, val_fraction: float, mode: str) -> None:
    """ValueError naming the option, before any input is read."""
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2 (one input and one target), got {seq_len}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if mode not in ("create", "overwrite"):
        raise ValueError(f"mode must be 'create' or 'overwrite', got {mode!r}")


def prep(input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
         tokenizer: str | os.PathLike[str], *, seq_len: int = 2048, text_field: str = "text", fmt: str | None = None,
         suffixes: Sequence[str] | None = None, val_fraction: float = 0.01,
         workers: int = 1, compression: str | None = None, size_limit: str | int = "64mb",
         hashes: list[str] | None = None, mode: str = "create", progress: Progress | None = None,
         engine: str = "local", address: str | None = None) -> PrepSummary:
    """Tokenize a corpus and write train/val MDS datasets of `seq_len`-token windows (module docstring).

    `engine="ray"` tokenizes on Ray (`address`: a running cluster; None: a local instance of `workers`)."""
    check_prep_options(seq_len, val_fraction, mode)
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    tokenizer = os.fspath(tokenizer)
    if engine == "ray":  # Ray workers do not share our working directory: hand them absolute paths
        tokenizer = os.path.abspath(tokenizer) if os.path.exists(tokenizer) else tokenizer
        items = [input] if isinstance(input, str | os.PathLike) else list(input)
        input = [p if "://" in os.fspath(p) else os.path.abspath(p) for p in items]
    tok = load_tokenizer(tokenizer)  # fail here, not in a worker, when the file is bad
    chunks = plan_corpus(input, fmt, suffixes)
    dtype = token_dtype(tok.vocab_size)
    summary = PrepSummary(out=str(out), tokenizer=tokenizer, vocab_size=tok.vocab_size, seq_len=seq_len,
                          dtype=dtype.name, workers=workers)
    columns = {"tokens": f"ndarray:{dtype.name}:{seq_len}"}
    options = dict(compression=compression, hashes=hashes, size_limit=size_limit, mode=mode)
    t0 = time.perf_counter()
    with ShardWriter(open_dataset_store(out, "train"), columns, **options) as train_w, \
            ShardWriter(open_dataset_store(out, "val"), columns, **options) as val_w:
        splits = {"train": WindowWriter(train_w, seq_len, dtype), "val": WindowWriter(val_w, seq_len, dtype)}
        tokenized = _tokenized_chunks(chunks, text_field, tokenizer, workers, engine, address)
        for done, (tokens, lengths, skipped) in enumerate(tokenized, 1):
            summary.skipped_files += skipped
            runs: dict[str, list[np.ndarray]] = {"train": [], "val": []}
            start = 0
            for length in lengths.tolist():
                split = "val" if is_validation(summary.documents, val_fraction) else "train"
                runs[split].append(tokens[start:start + length])
                summary.documents_per_split[split] += 1
                summary.documents += 1
                start += length
            for split, writer in splits.items():
                writer.add(runs[split])
                summary.windows[split] = writer.windows
            summary.tokens += int(len(tokens))
            summary.seconds = time.perf_counter() - t0
            if progress:
                progress(summary, done, len(chunks))
        if not summary.documents:  # a gzip file is a text file that is not UTF-8: say so, write nothing
            raise SourceError(f"{', '.join(input_names(input))}: no documents read"
                              + (f" ({summary.skipped_files:,} files skipped as not UTF-8 text)"
                                 if summary.skipped_files else ""))
        for split, writer in splits.items():
            summary.dropped_tokens[split] = len(writer.pending)
    summary.seconds = time.perf_counter() - t0
    return summary


def input_names(input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The input's files or folders as given, for messages."""
    return [os.fspath(input)] if isinstance(input, str | os.PathLike) else [os.fspath(p) for p in input]
