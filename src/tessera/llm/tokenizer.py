"""Tokenizers: a byte-level BPE trained on your corpus, and a byte tokenizer that needs no training.

Both have the same small interface (`Tokenizer`): `encode`, `encode_batch`, `decode`, `eos_id`,
`vocab_size`, `save`, and are saved as ONE JSON file read back by `load_tokenizer(path)`
(`load_tokenizer("byte")` gives the byte tokenizer). Nothing is downloaded.

    tok = train_bpe(["corpus/"], vocab_size=8192)   # text files, JSONL or Parquet (see `text_field`)
    tok.save("tok.json")
    ids = load_tokenizer("tok.json").encode("def f(): pass")

The end-of-text token `<|endoftext|>` separates documents. Text is encoded as plain text: a literal
"<|endoftext|>" inside a document is spelled out in bytes, never turned into the special token, so only
data prep (which appends `eos_id` after each document) puts document boundaries in the stream.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

EOS = "<|endoftext|>"
BYTE_TOKENIZER_TYPE = "tessera-byte"


class TokenizerError(ValueError):
    """A tokenizer file cannot be read or a tokenizer cannot be trained; the message names the file."""


class Tokenizer(Protocol):
    name: str

    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def save(self, path: str | os.PathLike[str]) -> None: ...


class ByteTokenizer:
    """UTF-8 bytes 0..255 are tokens 0..255; `<|endoftext|>` is 256."""

    name = "byte"

    @property
    def vocab_size(self) -> int:
        return 257

    @property
    def eos_id(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        out, run = [], bytearray()
        for i in ids:
            if i == 256:
                out.append(run.decode("utf-8", errors="replace") + EOS)
                run = bytearray()
            else:
                run.append(i)
        return "".join(out) + run.decode("utf-8", errors="replace")

    def save(self, path: str | os.PathLike[str]) -> None:
        _write_json(path, json.dumps({"type": BYTE_TOKENIZER_TYPE, "version": 1, "eos": EOS}))


class BPETokenizer:
    """A byte-level BPE (the `tokenizers` library), GPT-2 style pre-tokenization, no normalization."""

    def __init__(self, tokenizer, name: str = "bpe") -> None:  # noqa: ANN001 (tokenizers.Tokenizer)
        self.name = name
        self._tok = tokenizer
        self._tok.encode_special_tokens = True  # see the module docstring
        eos = tokenizer.token_to_id(EOS)
        if eos is None:
            raise TokenizerError(f"{name}: the tokenizer has no {EOS} token")
        self._eos = eos

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int:
        return self._eos

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast (tokenizers >= 0.21) skips character offsets, which we never use.
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def save(self, path: str | os.PathLike[str]) -> None:
        _write_json(path, self._tok.to_str())

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            return cls(HFTokenizer.from_file(os.fspath(path)), name=os.fspath(path))
        except Exception as exc:  # the Rust side raises a bare Exception for malformed files
            raise TokenizerError(f"{path}: not a tokenizer file ({exc})") from None


def _write_json(path: str | os.PathLike[str], text: str) -> None:
    """Write atomically (temp + rename): a half-written tokenizer would break every later step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """A tokenizer from its JSON file, or the byte tokenizer for "byte"."""
    if os.fspath(path) == "byte":
        return ByteTokenizer()
    p = Path(path)
    if not p.is_file():
        raise TokenizerError(f"{p}: no such tokenizer file (train one with `tessera llm tokenizer train`, "
                             "or use 'byte')")
    with open(p, "rb") as f:
        head = f.read(256)
    if BYTE_TOKENIZER_TYPE.encode() in head and json.loads(p.read_text()).get("type") == BYTE_TOKENIZER_TYPE:
        return ByteTokenizer()
    return BPETokenizer.from_file(p)


def train_bpe(inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], vocab_size: int, *,
              text_field: str = "text", fmt: str | None = None, suffixes: Sequence[str] | None = None,
              min_frequency: int = 2, max_bytes: int | None = None,
              special_tokens: Sequence[str] = ()) -> BPETokenizer:
    """Train a byte-level BPE of `vocab_size` tokens (256 bytes + merges + special tokens) on the inputs.

    Inputs are read as in data prep (`tessera.llm.corpus`). `max_bytes` stops reading after about that
    much text (the first documents, in input order).
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from tessera.llm.corpus import iter_documents, plan_corpus

    specials = [EOS, *(s for s in special_tokens if s != EOS)]
    if vocab_size < 256 + len(specials):
        raise TokenizerError(f"vocab_size {vocab_size} is too small: a byte-level BPE needs at least "
                             f"{256 + len(specials)} (256 bytes + special tokens)")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    def limited() -> Iterator[str]:
        seen = 0
        for doc in iter_documents(plan_corpus(inputs, fmt, suffixes), text_field):
            yield doc
            seen += len(doc.encode("utf-8"))
            if max_bytes is not None and seen >= max_bytes:
                return

    tok.train_from_iterator(limited(), trainer)
    return BPETokenizer(tok)
