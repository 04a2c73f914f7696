"""Tokenizers: byte-level BPE training, one-file save/load, round trips, the byte tokenizer."""

from __future__ import annotations

import json

import pytest
from llm_helpers import write_jsonl_corpus

from tessera.llm.tokenizer import EOS, BPETokenizer, ByteTokenizer, TokenizerError, load_tokenizer, train_bpe

SAMPLES = ["def f(x):\n    return x + 1\n", "naïve café — 日本語 ✓ 🙂", "", "  leading and trailing  ",
           "tabs\tand\r\nnewlines\n\n", "a literal <|endoftext|> inside a document"]


def test_byte_tokenizer_round_trip(tmp_path):
    tok = ByteTokenizer()
    assert tok.vocab_size == 257 and tok.eos_id == 256
    for text in SAMPLES:
        ids = tok.encode(text)
        assert max(ids, default=0) < 256 and tok.decode(ids) == text
    assert tok.encode_batch(SAMPLES) == [tok.encode(t) for t in SAMPLES]
    assert tok.decode(tok.encode("ab") + [256] + tok.encode("c")) == f"ab{EOS}c"
    tok.save(tmp_path / "byte.json")
    assert isinstance(load_tokenizer(tmp_path / "byte.json"), ByteTokenizer)
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)


def test_bpe_train_save_load_round_trip(bpe_path, text_corpus):
    text = json.loads(bpe_path.read_text())  # one self-contained JSON file
    assert text["model"]["type"] == "BPE"
    tok = load_tokenizer(bpe_path)
    assert isinstance(tok, BPETokenizer)
    assert tok.vocab_size <= 400 and tok.decode([tok.eos_id]) == EOS
    for sample in [*SAMPLES, *text_corpus[1][:5]]:
        assert tok.decode(tok.encode(sample)) == sample
    doc = text_corpus[1][0]
    assert len(tok.encode(doc)) < len(doc.encode()) / 2  # merges learned from the corpus compress it
    assert tok.encode_batch(SAMPLES) == [tok.encode(t) for t in SAMPLES]


def test_special_token_text_in_a_document_is_not_eos(bpe_path):
    tok = load_tokenizer(bpe_path)
    ids = tok.encode("x <|endoftext|> y")
    assert tok.eos_id not in ids
    assert tok.decode(ids) == "x <|endoftext|> y"


def test_training_is_deterministic_and_reads_jsonl(tmp_path):
    path = tmp_path / "docs.jsonl"
    docs = write_jsonl_corpus(path, 30, field="body")
    a = train_bpe(path, 300, text_field="body")
    b = train_bpe([path], 300, text_field="body")
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert a.decode(a.encode(docs[3])) == docs[3]
    with pytest.raises(ValueError, match="no field 'text'"):
        train_bpe(path, 300)


def test_training_skips_binary_files_and_filters_suffixes(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.py").write_text("def alpha(): return 1\n" * 50)
    (root / "b.txt").write_text("beta gamma delta\n" * 50)
    (root / "c.pyc").write_bytes(b"\x00\xff\xfe binary")
    only_py = train_bpe(root, 300, suffixes=[".py"], min_frequency=1)
    vocab = set(only_py._tok.get_vocab())
    assert any("alpha" in t for t in vocab) and not any("beta" in t for t in vocab)
    assert any("beta" in t for t in train_bpe(root, 300, min_frequency=1)._tok.get_vocab())


def test_errors(tmp_path):
    with pytest.raises(TokenizerError, match="too small"):
        train_bpe(tmp_path, 100)
    with pytest.raises(TokenizerError, match="no such tokenizer file"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a tokenizer"):
        load_tokenizer(tmp_path / "bad.json")
