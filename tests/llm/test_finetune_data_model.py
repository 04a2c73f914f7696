"""Tessera's GPT on packed rows: each example of a row gets exactly the loss it gets alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from llm_helpers import small_model

from tessera.llm.model import IGNORE_INDEX, packed_positions


def _per_token_losses(model, tokens, labels, **packed) -> torch.Tensor:
    logits = model(tokens[:, :-1], **{k: v[:, :-1] for k, v in packed.items()})
    return F.cross_entropy(logits.transpose(1, 2), labels[:, 1:], ignore_index=IGNORE_INDEX, reduction="none")


@pytest.mark.parametrize("attn", ["alibi", "rope"])
def test_packed_row_matches_examples_run_alone(attn: str) -> None:
    model = small_model(seed=3, attn=attn)
    torch.manual_seed(0)
    lengths = [7, 12, 5]
    examples = [torch.randint(0, 257, (n,)) for n in lengths]
    pad = 4
    row = torch.cat([*examples, torch.zeros(pad, dtype=torch.long)])[None]
    sequence_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)] + [torch.full((pad,), -1)])[None]
    position_ids = torch.cat([torch.arange(n) for n in [*lengths, pad]])[None]
    labels = row.clone()
    labels[0, -pad:] = IGNORE_INDEX
    start = 0
    with torch.no_grad():
        packed = _per_token_losses(model, row, labels, position_ids=position_ids, sequence_ids=sequence_ids)[0]
        for ex in examples:
            alone = _per_token_losses(model, ex[None], ex[None])[0]
            n = len(ex)
            # packed[t] predicts row[t+1]; the example's own predictions are packed[start:start+n-1]
            torch.testing.assert_close(packed[start:start + n - 1], alone, rtol=1e-5, atol=1e-5)
            start += n
        # the batch loss ignores the predictions that would cross into the next example
        batch = {"tokens": row, "labels": labels, "position_ids": position_ids, "sequence_ids": sequence_ids}
        expected = torch.cat([_per_token_losses(model, ex[None], ex[None])[0] for ex in examples]).mean()
        torch.testing.assert_close(model(batch), expected, rtol=1e-5, atol=1e-5)
        # either id gives the other
        only_pos = model({"tokens": row, "labels": labels, "position_ids": position_ids})
        torch.testing.assert_close(only_pos, expected, rtol=1e-5, atol=1e-5)


def test_packed_positions_derive_each_other() -> None:
    seq = torch.tensor([[0, 0, 0, 1, 1, -1, -1]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1]])
    assert torch.equal(packed_positions(None, seq)[0], pos)
    derived = packed_positions(pos, None)[1]
    assert torch.equal(derived[:, 1:] != derived[:, :-1], seq[:, 1:] != seq[:, :-1])
