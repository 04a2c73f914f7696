"""HFCausalLM keeps GPT's contract: the loss of tokens/labels, packed rows kept apart, no NaN on masks."""

from __future__ import annotations

import pytest
import torch
from hf_fixtures import tiny_llama

from tessera.llm.hf.config import PretrainedSpec
from tessera.llm.hf.load import load_hf


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tmp_path_factory):
    folder = tiny_llama(tmp_path_factory.mktemp("llama") / "m", seed=2)
    return load_hf(PretrainedSpec(pretrained=str(folder), attn_implementation=request.param))[0].eval()


def test_loss_is_transformers_loss_with_labels(model):
    tokens = torch.randint(0, 300, (2, 12))
    labels = tokens.clone()
    labels[:, :5] = -100
    expected = model.hf(input_ids=tokens, labels=labels).loss
    torch.testing.assert_close(model({"tokens": tokens, "labels": labels}), expected)
    torch.testing.assert_close(model({"tokens": tokens}), model.hf(input_ids=tokens, labels=tokens).loss)
    masked = model({"tokens": tokens, "labels": torch.full_like(tokens, -100)})
    assert masked.item() == 0.0  # a microbatch with nothing to learn adds nothing, not NaN


@pytest.mark.parametrize("with_sequence_ids", [True, False])
def test_packed_rows_do_not_attend_across_examples(model, with_sequence_ids):
    a, b = torch.randint(0, 300, (1, 7)), torch.randint(0, 300, (1, 6))
    tokens = torch.cat([a, b], 1).repeat(2, 1)
    positions = torch.cat([torch.arange(7), torch.arange(6)]).repeat(2, 1)
    batch = {"tokens": tokens, "labels": tokens, "position_ids": positions}
    if with_sequence_ids:
        batch["sequence_ids"] = torch.cat([torch.zeros(7), torch.ones(6)]).long().repeat(2, 1)
    with torch.no_grad():
        loss = model(batch)
        # each example alone; the first token of b is not predicted from a's last token in the packed row
        sa = model.hf(input_ids=a, labels=a).loss * 6
        sb = model.hf(input_ids=b, labels=b).loss * 5
        logits_a = model.hf(input_ids=a).logits
    labels = tokens.clone()
    labels[:, 7] = -100  # the data side masks each example's first token
    batch["labels"] = labels
    with torch.no_grad():
        separate = model(batch)
    torch.testing.assert_close(separate, (sa + sb) / 11, atol=1e-5, rtol=1e-5)
    assert not torch.isclose(loss, separate)
    inputs = model._attention_inputs(batch)
    assert inputs["attention_mask"].shape == (2, 1, 12, 12)
    with torch.no_grad():
        packed_logits = model.hf(input_ids=tokens[:, :-1], **inputs).logits
    torch.testing.assert_close(packed_logits[:1, :7], logits_a, atol=1e-5, rtol=1e-5)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    folder = tiny_llama(tmp_path / "small-vocab", vocab_size=200)
    with pytest.raises(ValueError, match="320 tokens but the model's embedding only 200"):
        load_hf(PretrainedSpec(pretrained=str(folder)))
