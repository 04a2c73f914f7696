"""The documents of a text corpus, in chunks that depend only on the input (never on the process count).

Formats: `text` (a folder of files, one document per file), `lines` (one document per line), `jsonl`
and `parquet` (one document per record, taken from `text_field`). JSONL and Parquet chunks come from
`shards.sources.plan_chunks`; text folders are planned here so that `suffixes` can select files
(e.g. only `.py`) and files that are not UTF-8 (compiled caches, images) are skipped and counted,
not fatal: a real corpus folder is rarely clean.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.shards.sources import Chunk, SourceError, detect_format, plan_chunks, read_chunk

TEXT_FORMATS = ("text", "lines", "jsonl", "parquet", "arrow")  # arrow: a Hugging Face save_to_disk folder
FILES_PER_CHUNK = 64  # text files per chunk: small enough to spread a source tree over the workers


@dataclass
class ChunkText:
    """The documents of one chunk, and how many files it skipped as not UTF-8."""

    documents: list[str] = field(default_factory=list)
    skipped: int = 0


def _text_files(root: Path, suffixes: Sequence[str] | None) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SourceError(f"{root}: no such file or folder")
    wanted = {s.lower() if s.startswith(".") else f".{s.lower()}" for s in suffixes or ()}
    files = [p for p in root.rglob("*") if p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(root).parts)
             and (not wanted or p.suffix.lower() in wanted)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def plan_corpus(inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], fmt: str | None = None,
                suffixes: Sequence[str] | None = None) -> list[Chunk]:
    """Chunks of every input, in order. `fmt` is guessed per input when not given."""
    paths = [inputs] if isinstance(inputs, str | os.PathLike) else list(inputs)
    chunks: list[Chunk] = []
    for item in paths:
        path = Path(item)
        kind = fmt or detect_format(path)
        if kind not in TEXT_FORMATS:
            raise SourceError(f"{path}: format {kind!r} is not a text corpus; use one of {', '.join(TEXT_FORMATS)}")
        if kind == "text":
            files = [str(f) for f in _text_files(path, suffixes)]
            chunks += [Chunk("text", str(path), files=tuple(files[i:i + FILES_PER_CHUNK]))
                       for i in range(0, len(files), FILES_PER_CHUNK)]
        else:
            chunks += plan_chunks(path, kind)
    if not chunks:
        raise SourceError(f"{', '.join(map(str, paths))}: no input files"
                          + (f" with suffix {', '.join(suffixes)}" if suffixes else ""))
    return chunks


def document_text(sample: dict[str, Any], text_field: str, label: str) -> str:
    try:
        text = sample[text_field]
    except KeyError:
        raise SourceError(f"{label}: no field {text_field!r} in a record with fields {sorted(sample)}; "
                          "choose one with --text-field") from None
    if not isinstance(text, str):
        raise SourceError(f"{label}: field {text_field!r} holds {type(text).__name__}, not text")
    return text


def read_documents(chunk: Chunk, text_field: str = "text") -> ChunkText:
    out = ChunkText()
    if chunk.kind == "text":
        for f in chunk.files:
            try:
                out.documents.append(Path(f).read_bytes().decode("utf-8"))
            except UnicodeDecodeError:
                out.skipped += 1
        return out
    field_name = "text" if chunk.kind == "lines" else text_field
    out.documents = [document_text(s, field_name, chunk.path) for s in read_chunk(chunk)]
    return out


def iter_documents(chunks: Sequence[Chunk], text_field: str = "text") -> Iterator[str]:
    for chunk in chunks:
        yield from read_documents(chunk, text_field).documents
