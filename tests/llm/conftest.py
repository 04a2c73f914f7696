"""Small corpora, tokenizers, models and prepared data shared by the tests/llm modules."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from llm_helpers import WORDS, make_doc, small_config, small_model, write_jsonl_corpus, write_text_corpus  # noqa: F401  (fixtures below use them; tests import llm_helpers)


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
