"""Fine-tuning data prep: examples (chat, instruction, text) to MDS rows of the context length.

    prep_examples("chat.jsonl", "s3://bucket/sft", "tok/", seq_len=2048, fmt="chat")

gives `OUT/train/` (and `OUT/val/` when `val_fraction` > 0), MDS datasets whose columns are listed in
`packing.py`, and `OUT/finetune-prep.json`, the summary (counts, padding share) the trainer logs.

One pass, each step in one place:
  read (`reader.py`: lines in bounded memory, JSON) -> validate (`rows.py`: the typed row of its form)
  -> encode (`examples.py`: tokens, loss mask, truncation) -> pack (`packing.py`) -> write (MDS).
The options are checked once, by `config.ExampleOptions`.

A row that is not a valid record is refused with one line, "FILE, line N: what is wrong"
(`ExampleError`), before any row is written for good (the writer aborts); with `on_bad_row="skip"` it is
left out and counted (`bad_rows`, and the first one's message in `first_bad_row`). Either way a prep
that keeps no example fails: there is nothing to train on.

As in pre-training prep (`tessera.llm.prep`), and for the same reason, the output does not depend on
`workers`: the input is split into chunks that depend only on the input, workers read, validate and
encode whole chunks, and the main process takes chunks strictly in input order, numbers the records
globally, sends each to val or train by a hash of its number, and builds rows.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from tessera.llm.finetune.chat import ChatTemplateError, ExampleTokenizer, load_example_tokenizer
from tessera.llm.finetune.config import ExampleOptions
from tessera.llm.finetune.examples import FORMATS, bounded, encode_row, fit
from tessera.llm.finetune.packing import RowBuilder, pack_columns, pad_columns
from tessera.llm.finetune.reader import BadRecord, ChunkRecords, Places, plan_examples
from tessera.llm.finetune.rows import ExampleError, parse_row
from tessera.llm.prep import SPLITS, check_prep_options, input_names, is_validation, map_in_order, token_dtype
from tessera.shards.dataset import open_dataset_store
from tessera.shards.sources import Chunk
from tessera.shards.writer import ShardWriter
from tessera.storage import open_store
from tessera.typed_config import error_lines

SUMMARY_NAME = "finetune-prep.json"
ExampleProgress = Callable[["ExamplePrepSummary", int, int], None]


@dataclass
class ExamplePrepSummary:
    out: str
    tokenizer: str
    vocab_size: int
    seq_len: int
    format: str
    loss_on: str
    truncation: str
    pack: bool
    workers: int
    on_bad_row: str = "error"
    records: int = 0  # rows read, bad ones included
    examples: int = 0  # records kept
    bad_rows: int = 0  # skipped as not valid records (on_bad_row="skip")
    first_bad_row: str = ""  # "FILE, line N: what is wrong" of the first one
    truncated: int = 0
    dropped_too_long: int = 0
    dropped_no_loss: int = 0  # nothing left to learn (no assistant reply, or truncated away)
    tokens: int = 0  # tokens of the kept examples, EOS included
    loss_tokens: int = 0
    rows: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    padding_tokens: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    seconds: float = 0.0

    @property
    def padding_share(self) -> float:
        """Padding tokens over all tokens written (both splits): the compute spent on nothing."""
        total = sum(self.rows.values()) * self.seq_len
        return sum(self.padding_tokens.values()) / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "padding_share": self.padding_share}


@dataclass
class ChunkExamples:
    """The encoded examples of one chunk: tokens and loss mask concatenated, one length per record (0 for
    a dropped or bad one), the bad records (position in the chunk, what is wrong), the lines the chunk
    covered, and the counts of what happened to the examples."""

    tokens: np.ndarray
    loss: np.ndarray
    lengths: np.ndarray
    bad: list[tuple[int, str]] = field(default_factory=list)
    covered: int = 0
    truncated: int = 0
    too_long: int = 0
    no_loss: int = 0


# --- worker side: read, validate, encode ---------------------------------------------------------------

_worker_tokenizer: ExampleTokenizer | None = None


def _init_worker(tokenizer: Any) -> None:
    global _worker_tokenizer
    _worker_tokenizer = load_example_tokenizer(tokenizer)


def encode_chunk(chunk: Chunk, opts: ExampleOptions, seq_len: int) -> ChunkExamples:
    """Every record of the chunk read, validated and encoded; with on_bad_row="error" it stops at the
    first bad one, which the main process reports."""
    tok = _worker_tokenizer
    assert tok is not None, "call _init_worker first"
    out = ChunkExamples(np.zeros(0, np.uint32), np.zeros(0, bool), np.zeros(0, np.int64))
    tokens, losses, lengths = [], [], []
    records = ChunkRecords(chunk, opts.max_record_bytes)
    preprocess = record_function(opts.preprocessing_fn) if opts.preprocessing_fn else None
    for position, record in records:
        try:
            if isinstance(record, BadRecord):
                raise ExampleError(record.reason)
            if preprocess is not None:
                record = _preprocessed(preprocess, record, opts.preprocessing_fn)
            row = bounded(parse_row(record, opts.format, opts.text_field), tok, seq_len, opts.loss_on)
            kept = fit(encode_row(row, tok, opts.loss_on), seq_len, opts.truncation)
        except (ExampleError, ChatTemplateError) as exc:
            out.bad.append((position, str(exc)))
            lengths.append(0)
            if opts.on_bad_row == "error":
                break
            continue
        if kept is None:
            out.too_long += 1
        elif not kept.loss.any():
            out.no_loss += 1
            kept = None
        elif kept.truncated:
            out.truncated += 1
        lengths.append(0 if kept is None else len(kept.tokens))
        if kept is not None:
            tokens.append(kept.tokens.astype(np.uint32))
            losses.append(kept.loss)
    if tokens:
        out.tokens, out.loss = np.concatenate(tokens), np.concatenate(losses)
    out.lengths = np.asarray(lengths, dtype=np.int64)
    out.covered = records.covered
    return out


def record_function(path: str) -> Callable[[Any], Any]:
    """The `module.path:function` of `preprocessing_fn`, imported (once per process); ExampleError naming it."""
    module, _, name = path.partition(":")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ExampleError(f"preprocessing_fn={path}: cannot import it ({exc}); put its module on PYTHONPATH") from None
    if not callable(function):
        raise ExampleError(f"preprocessing_fn={path}: not a function")
    return function


def function_fingerprint(path: str) -> str:
    """A hash of the source file that defines `preprocessing_fn` (the function's own module): the prep
    cache keys on it, so an edited function prepares again instead of serving the rows the old one made.
    What it calls in other modules is not followed; a function without a source file hashes its name."""
    function = record_function(path)
    try:
        source = inspect.getsourcefile(function)
    except TypeError:  # a builtin or C function
        source = None
    return hashlib.sha256(Path(source).read_bytes() if source else path.encode()).hexdigest()


def _preprocessed(function: Callable[[Any], Any], record: Any, path: str | None) -> Any:
    """The record as the user's function returns it; whatever it raises makes the record a bad row."""
    try:
        return function(record)
    except Exception as exc:  # the user's code: any failure is this record's, reported with its place
        raise ExampleError(f"preprocessing_fn={path} raised {type(exc).__name__}: {exc}") from None


def _encode_task(args: tuple[Chunk, ExampleOptions, int]) -> ChunkExamples:
    return encode_chunk(*args)


def _encoded_chunks(chunks: list[Chunk], opts: ExampleOptions, seq_len: int, tokenizer: Any,
                    workers: int) -> Iterator[ChunkExamples]:
    """Each chunk's examples, in chunk order, whatever the number of processes."""
    return map_in_order(_encode_task, [(c, opts, seq_len) for c in chunks], _init_worker, tokenizer, workers)


# --- main side: number, split, pack, write -------------------------------------------------------------


def example_options(**options: Any) -> ExampleOptions:
    """The options, checked: ValueError with one line naming the first wrong one."""
    try:
        return ExampleOptions(**options)
    except ValidationError as exc:
        raise ValueError("; ".join(error_lines(exc))) from None


def prep_examples(input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                  tokenizer: Any, *, seq_len: int = 2048, fmt: str = "auto", val_fraction: float = 0.0,
                  workers: int = 1, compression: str | None = None, size_limit: str | int = "64mb",
                  mode: str = "create", progress: ExampleProgress | None = None,
                  **options: Any) -> ExamplePrepSummary:
    """Encode fine-tuning examples and write them as MDS rows of `seq_len` (module docstring).

    `tokenizer`: "byte", a tokenizer JSON, a local transformers tokenizer folder, or a tokenizer object.
    `options`: `ExampleOptions`' fields (loss_on, truncation, pack, text_field, on_bad_row, max_record_bytes).
    """
    opts = example_options(format=fmt, **options)
    if opts.preprocessing_fn:
        record_function(opts.preprocessing_fn)  # fail here, not in a worker, when it cannot be imported
    check_prep_options(seq_len, val_fraction, mode)
    tok = load_example_tokenizer(tokenizer)  # fail here, not in a worker, when it is bad
    spec = tokenizer if isinstance(tokenizer, str | os.PathLike) else tok.inner
    chunks = plan_examples(input)
    dtype = token_dtype(tok.vocab_size)
    summary = ExamplePrepSummary(out=str(out), tokenizer=tok.name, vocab_size=tok.vocab_size, seq_len=seq_len,
                                 format=opts.format, loss_on=opts.loss_on, truncation=opts.truncation,
                                 pack=opts.pack, workers=workers, on_bad_row=opts.on_bad_row)
    columns = (pack_columns if opts.pack else pad_columns)(seq_len, dtype)
    splits = [s for s in SPLITS if s == "train" or val_fraction > 0]
    places = Places()
    t0 = time.perf_counter()
    with ExitStack() as stack:
        writers = {s: stack.enter_context(ShardWriter(open_dataset_store(out, s), columns, compression=compression,
                                                      size_limit=size_limit, mode=mode)) for s in splits}
        builders = {s: RowBuilder(seq_len, tok.eos_id, dtype, pack=opts.pack) for s in splits}
        for done, (chunk, part) in enumerate(zip(chunks, _encoded_chunks(chunks, opts, seq_len, spec, workers),
                                                 strict=True), 1):
            places.enter(chunk)
            _bad_rows(part, places, summary)
            places.leave(part.covered)
            _add_chunk(part, summary, builders, writers, val_fraction)
            summary.seconds = time.perf_counter() - t0
            if progress:
                progress(summary, done, len(chunks))
        _nothing_left(summary, input)
        for split, builder in builders.items():
            for row in builder.finish():
                writers[split].write(row.columns)
            summary.rows[split], summary.padding_tokens[split] = builder.written, builder.padding_tokens
    summary.seconds = time.perf_counter() - t0
    open_store(out).put(SUMMARY_NAME, json.dumps(summary.to_dict(), indent=1).encode())
    return summary


def _bad_rows(part: ChunkExamples, places: Places, summary: ExamplePrepSummary) -> None:
    """Refuse the chunk's first bad row (on_bad_row="error"), or count them (skip)."""
    for position, reason in part.bad:
        message = f"{places.where(position)}: {reason}"
        if summary.on_bad_row == "error":
            raise ExampleError(f"{message} (on_bad_row skip leaves such rows out)")
        summary.bad_rows += 1
        summary.first_bad_row = summary.first_bad_row or message


def _nothing_left(summary: ExamplePrepSummary, input: Any) -> None:
    """ExampleError when no example was kept: a run on these rows would train on nothing."""
    if summary.examples:
        return
    name = ", ".join(input_names(input))
    why = [f"{n:,} {what}" for n, what in ((summary.bad_rows, "bad rows skipped"),
                                           (summary.dropped_too_long, "too long (truncation=drop)"),
                                           (summary.dropped_no_loss, "without a reply to learn")) if n]
    first = f"; first bad row: {summary.first_bad_row}" if summary.first_bad_row else ""
    raise ExampleError(f"{name}: no example left to train on, of {summary.records:,} records"
                       + (f" ({', '.join(why)})" if why else "") + first)


def _add_chunk(part: ChunkExamples, summary: ExamplePrepSummary, builders: dict[str, RowBuilder],
               writers: dict[str, ShardWriter], val_fraction: float) -> None:
    """Number the chunk's records, split them, and write the rows their examples complete."""
    start = 0
    for length in part.lengths.tolist():
        record, summary.records = summary.records, summary.records + 1
        if not length:
            continue
        split = "val" if is_validation(record, val_fraction) else "train"
        tokens, loss = part.tokens[start:start + length], part.loss[start:start + length]
        for row in builders[split].add(tokens, loss):
            writers[split].write(row.columns)
        summary.examples += 1
        summary.tokens += length
        summary.loss_tokens += int(loss.sum())
        start += length
    summary.truncated += part.truncated
    summary.dropped_too_long += part.too_long
    summary.dropped_no_loss += part.no_loss


def read_summary(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The summary a prep wrote into `folder`, None when there is none."""
    path = os.path.join(os.fspath(folder), SUMMARY_NAME)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


__all__ = ["FORMATS", "ExamplePrepSummary", "plan_examples", "prep_examples", "read_summary"]
