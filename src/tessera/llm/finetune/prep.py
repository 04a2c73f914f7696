"""Fine-tuning data prep: examples (chat, instruction, text) to MDS rows of the context length.

    prep_examples("chat.jsonl", "s3://bucket/sft", "tok/", seq_len=2048, fmt="chat")

gives `OUT/train/` (and `OUT/val/` when `val_fraction` > 0), MDS datasets whose columns are listed in
`packing.py`, and `OUT/finetune-prep.json`, the summary (counts, padding share) the trainer logs.

As in pre-training prep (`tessera.llm.prep`), and for the same reason, the output does not depend on
`workers`: the input is split into chunks that depend only on the input (JSONL byte ranges, Parquet
row groups, groups of text files; local or in a bucket), workers encode whole chunks (`examples.py`:
tokens, loss mask, truncation), and the main process takes chunks strictly in input order, numbers the
records globally, sends each to val or train by a hash of its number, and builds rows (`packing.py`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tessera.llm.corpus import plan_corpus, read_documents
from tessera.llm.finetune.chat import ExampleTokenizer, load_example_tokenizer
from tessera.llm.finetune.examples import FORMATS, ExampleError, encode_record, fit
from tessera.llm.finetune.packing import RowBuilder, pack_columns, pad_columns
from tessera.llm.prep import SPLITS, check_prep_options, is_validation, map_in_order, token_dtype
from tessera.shards.dataset import open_dataset_store
from tessera.shards.inputs import is_url
from tessera.shards.sources import Chunk, SourceError, detect_format, locate, plan_chunks, read_chunk_located
from tessera.shards.writer import ShardWriter
from tessera.storage import open_store

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
    records: int = 0
    examples: int = 0  # records kept
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


@dataclass(frozen=True)
class EncodeOptions:
    fmt: str
    loss_on: str
    truncation: str
    text_field: str
    seq_len: int


@dataclass
class ChunkExamples:
    """The encoded examples of one chunk: tokens and loss mask concatenated, one length per record (0 for
    a dropped record), and the counts of what happened to them."""

    tokens: np.ndarray
    loss: np.ndarray
    lengths: np.ndarray
    truncated: int = 0
    too_long: int = 0
    no_loss: int = 0


def plan_examples(inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Chunk]:
    """Chunks of every input, in order: JSONL or Parquet files (or folders of them, local or in a bucket),
    or text files (one example each)."""
    items = [inputs] if isinstance(inputs, str | os.PathLike) else list(inputs)
    chunks: list[Chunk] = []
    for item in items:
        path = os.fspath(item)
        kind = detect_format(path)
        if kind in ("jsonl", "parquet"):
            chunks += plan_chunks(path, kind)
        elif kind == "text" and not is_url(path):
            chunks += plan_corpus(path, "text")
        else:
            raise SourceError(f"{path}: fine-tuning examples are read from JSONL or Parquet (or local text "
                              f"files), not {kind}")
    if not chunks:
        raise SourceError(f"{', '.join(map(os.fspath, items))}: no input files")
    return chunks


def _records(chunk: Chunk) -> Iterator[tuple[str, dict[str, Any]]]:
    if chunk.kind == "text":
        for i, doc in enumerate(read_documents(chunk).documents):
            yield f"{chunk.path}, file {i + 1} of its chunk", {"text": doc}
        return
    for position, record in read_chunk_located(chunk):
        yield locate(chunk, position), record


# --- worker side ---------------------------------------------------------------------------------------

_worker_tokenizer: ExampleTokenizer | None = None


def _init_worker(tokenizer: Any) -> None:
    global _worker_tokenizer
    _worker_tokenizer = load_example_tokenizer(tokenizer)


def encode_chunk(chunk: Chunk, opts: EncodeOptions) -> ChunkExamples:
    tok = _worker_tokenizer
    assert tok is not None, "call _init_worker first"
    tokens, losses, lengths = [], [], []
    out = ChunkExamples(np.zeros(0, np.uint32), np.zeros(0, bool), np.zeros(0, np.int64))
    for where, record in _records(chunk):
        try:
            encoded = encode_record(record, opts.fmt, tok, loss_on=opts.loss_on, text_field=opts.text_field,
                                    where=where)
        except (ExampleError, ValueError) as exc:
            raise ExampleError(str(exc) if where in str(exc) else f"{where}: {exc}") from None
        kept = fit(encoded, opts.seq_len, opts.truncation)
        if kept is None:
            out.too_long += 1
        elif not kept.loss.any():
            out.no_loss += 1
            kept = None
        elif kept.truncated:
            out.truncated += 1
        if kept is None:
            lengths.append(0)
            continue
        tokens.append(kept.tokens.astype(np.uint32))
        losses.append(kept.loss)
        lengths.append(len(kept.tokens))
    if tokens:
        out.tokens, out.loss = np.concatenate(tokens), np.concatenate(losses)
    out.lengths = np.asarray(lengths, dtype=np.int64)
    return out


def _encode_task(args: tuple[Chunk, EncodeOptions]) -> ChunkExamples:
    return encode_chunk(*args)


def _encoded_chunks(chunks: list[Chunk], opts: EncodeOptions, tokenizer: Any,
                    workers: int) -> Iterator[ChunkExamples]:
    """Each chunk's examples, in chunk order, whatever the number of processes."""
    return map_in_order(_encode_task, [(c, opts) for c in chunks], _init_worker, tokenizer, workers)


# --- main side -----------------------------------------------------------------------------------------


def prep_examples(input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                  tokenizer: Any, *, seq_len: int = 2048, fmt: str = "auto", loss_on: str = "all_assistant",
                  truncation: str = "prompt_first", pack: bool = True, text_field: str = "text",
                  val_fraction: float = 0.0, workers: int = 1, compression: str | None = None,
                  size_limit: str | int = "64mb", mode: str = "create",
                  progress: ExampleProgress | None = None) -> ExamplePrepSummary:
    """Encode fine-tuning examples and write them as MDS rows of `seq_len` (module docstring).

    `tokenizer`: "byte", a tokenizer JSON, a local transformers tokenizer folder, or a tokenizer object.
    """
    from tessera.llm.finetune.config import check_options

    check_options(fmt=fmt, loss_on=loss_on, truncation=truncation)
    check_prep_options(seq_len, val_fraction, mode)
    tok = load_example_tokenizer(tokenizer)  # fail here, not in a worker, when it is bad
    spec = tokenizer if isinstance(tokenizer, str | os.PathLike) else tok.inner
    chunks = plan_examples(input)
    dtype = token_dtype(tok.vocab_size)
    summary = ExamplePrepSummary(out=str(out), tokenizer=tok.name, vocab_size=tok.vocab_size, seq_len=seq_len,
                                 format=fmt, loss_on=loss_on, truncation=truncation, pack=pack, workers=workers)
    columns = (pack_columns if pack else pad_columns)(seq_len, dtype)
    options = dict(compression=compression, size_limit=size_limit, mode=mode)
    splits = [s for s in SPLITS if s == "train" or val_fraction > 0]
    opts = EncodeOptions(fmt, loss_on, truncation, text_field, seq_len)
    t0 = time.perf_counter()
    with ExitStack() as stack:
        writers = {s: stack.enter_context(ShardWriter(open_dataset_store(out, s), columns, **options))
                   for s in splits}
        builders = {s: RowBuilder(seq_len, tok.eos_id, dtype, pack=pack) for s in splits}
        for done, part in enumerate(_encoded_chunks(chunks, opts, spec, workers), 1):
            _add_chunk(part, summary, builders, writers, val_fraction)
            summary.seconds = time.perf_counter() - t0
            if progress:
                progress(summary, done, len(chunks))
        for split, builder in builders.items():
            for row in builder.finish():
                writers[split].write(row.columns)
            summary.rows[split], summary.padding_tokens[split] = builder.written, builder.padding_tokens
    summary.seconds = time.perf_counter() - t0
    open_store(out).put(SUMMARY_NAME, json.dumps(summary.to_dict(), indent=1).encode())
    return summary


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
