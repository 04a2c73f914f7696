"""Small corpora and models shared by the tests/llm modules.

A module of its own, not conftest.py: processes that tests spawn import it by name, and `conftest` would
resolve to tests/conftest.py there.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from tessera.llm.model import GPT, GPTConfig

WORDS = ("def class return import from lambda yield with open file read write data model token value index "
         "list dict set tuple int str float none true false self args kwargs print range len sum max min "
         "the a of to in is for on and that this").split()


def make_doc(rng: random.Random, n_words: int) -> str:
    """A pseudo-document: a few lines of words, with some non-ASCII text so UTF-8 paths are exercised."""
    lines = []
    for _ in range(max(1, n_words // 8)):
        lines.append(" ".join(rng.choice(WORDS) for _ in range(8)))
    if rng.random() < 0.3:
        lines.append("naïve café — 日本語 ✓")
    return "\n".join(lines) + "\n"


def write_text_corpus(root: Path, n_docs: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = [make_doc(rng, rng.randint(8, 80)) for _ in range(n_docs)]
    root.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(docs):
        (root / f"doc{i:04d}.txt").write_text(doc, encoding="utf-8")
    return docs


def write_jsonl_corpus(path: Path, n_docs: int, seed: int = 0, field: str = "text") -> list[str]:
    rng = random.Random(seed)
    docs = [make_doc(rng, rng.randint(4, 60)) for _ in range(n_docs)]
    with open(path, "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, field: doc}) + "\n")
    return docs


def small_config(**overrides) -> GPTConfig:
    base = dict(d_model=32, n_heads=4, n_layers=2, vocab_size=257, max_seq_len=64)
    return GPTConfig(**{**base, **overrides})


def small_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(small_config(**overrides)).eval()


def assert_one_line_error(result, code: int, *needles: str) -> str:
    """The command (a CliRunner result) exited `code` with exactly one `error:` line that names every
    needle, and no traceback."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]
