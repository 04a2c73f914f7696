"""Export: safetensors + config JSON (+ tokenizer) round trip, and loading from a training checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from llm_helpers import small_model

from tessera.llm.export import ExportError, load_model, load_pretrained, save_pretrained
from tessera.llm.tokenizer import ByteTokenizer, load_tokenizer


@pytest.mark.parametrize("variant", [dict(), dict(attn="rope", norm="rmsnorm", tie_embeddings=False, no_bias=False)])
def test_round_trip_local(tmp_path, bpe_path, variant):
    model = small_model(seed=4, vocab_size=400, **variant)
    tok = load_tokenizer(bpe_path)
    save_pretrained(model, tmp_path / "export", tokenizer=tok)
    assert {p.name for p in (tmp_path / "export").iterdir()} == {"config.json", "model.safetensors", "tokenizer.json"}
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["format"] == "tessera-gpt" and config["model"] == model.cfg.to_dict()
    loaded, loaded_tok = load_pretrained(tmp_path / "export")
    assert loaded.cfg == model.cfg
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)
    x = torch.randint(0, 400, (2, 12))
    assert torch.equal(model(x), loaded(x))
    assert loaded_tok.encode("hello world") == tok.encode("hello world")


def test_round_trip_through_a_bucket_url_without_tokenizer():
    model = small_model(seed=5)
    url = save_pretrained(model, "memory://export-test/models/m1")
    loaded, tok = load_model("memory://export-test/models/m1")
    assert tok is None and url.endswith("m1")
    x = torch.randint(0, 257, (1, 9))
    assert torch.equal(model(x), loaded(x))


def test_load_from_a_training_checkpoint(tmp_path):
    from tessera.train.checkpoint import CheckpointManager, capture_state
    from tessera.train.time import Timestamp

    model = small_model(seed=6, attn="rope")
    run_config = {"model": {**model.cfg.to_dict(), "init_device": "cpu"}, "tokenizer": {"path": "byte"}}
    with CheckpointManager(tmp_path / "ckpt", async_save=False) as mgr:
        mgr.save(capture_state(model, timestamp=Timestamp(batch=3), config=run_config))
    loaded, tok = load_model(tmp_path / "ckpt")
    assert isinstance(tok, ByteTokenizer)
    x = torch.randint(0, 257, (1, 7))
    assert torch.equal(model(x), loaded(x))


def test_not_a_model(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="neither a model export"):
        load_model(tmp_path / "empty")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"format": "something-else"}')
    with pytest.raises(ExportError, match="not a tessera model export"):
        load_pretrained(tmp_path / "other")
