"""Small corpora, tokenizers, models and prepared data shared by the tests/llm modules."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
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


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These models are tiny: one thread is fastest, and on a busy 2-core machine two OpenMP threads
    spin-wait for each other (25x slower, measured). Restored after each test for the other suites."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def text_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("corpus") / "docs"
    docs = write_text_corpus(root, 40)
    return root, docs


@pytest.fixture(scope="session")
def bpe_path(tmp_path_factory: pytest.TempPathFactory, text_corpus) -> Path:
    from tessera.llm.tokenizer import train_bpe

    path = tmp_path_factory.mktemp("tok") / "tok.json"
    train_bpe([text_corpus[0]], vocab_size=400).save(path)
    return path


@pytest.fixture(scope="session")
def prepped(tmp_path_factory: pytest.TempPathFactory, text_corpus) -> Path:
    """The text corpus prepared with the byte tokenizer into 32-token windows (train + val)."""
    from tessera.llm.prep import prep

    out = tmp_path_factory.mktemp("prepped") / "data"
    prep(text_corpus[0], out, "byte", seq_len=32, val_fraction=0.2)
    return out


CHAT_WORDS = "hi hello there bye goodbye what is two plus four six ok".split()


@pytest.fixture
def chat_file(tmp_path: Path) -> Path:
    """60 short chat examples (a user question, an assistant reply) as JSONL."""
    rng = random.Random(1)
    path = tmp_path / "chat.jsonl"
    with open(path, "w") as f:
        for _ in range(60):
            q, a = " ".join(rng.choices(CHAT_WORDS, k=3)), " ".join(rng.choices(CHAT_WORDS, k=4))
            f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                             {"role": "assistant", "content": a}]}) + "\n")
    return path
