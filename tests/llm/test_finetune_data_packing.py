"""Packing and padding invariants, for any example lengths (hypothesis)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.llm.finetune.batch import ExampleBatch, padding_share
from tessera.llm.finetune.packing import PAD_SEQUENCE, RowBuilder

PAD = 0


def build(lengths: list[int], seq_len: int, pack: bool, open_rows: int = 8) -> tuple[list[dict], list[np.ndarray],
                                                                                      RowBuilder]:
    """Rows of examples whose tokens are unique (example i holds 1000 * (i + 1) + position)."""
    builder = RowBuilder(seq_len, PAD, np.dtype(np.uint32), pack=pack, open_rows=open_rows)
    examples, rows = [], []
    for i, n in enumerate(lengths):
        tokens = np.arange(n, dtype=np.uint32) + 1000 * (i + 1)
        loss = np.ones(n, dtype=bool)  # every token a target: the builder must still clear each first one
        examples.append(tokens)
        rows += [r.columns for r in builder.add(tokens, loss)]
    rows += [r.columns for r in builder.finish()]
    return rows, examples, builder


lengths_and_len = st.integers(2, 40).flatmap(
    lambda L: st.tuples(st.lists(st.integers(1, L), min_size=1, max_size=30), st.just(L), st.integers(1, 4)))


@settings(max_examples=150, deadline=None)
@given(lengths_and_len)
def test_packed_rows_hold_every_example_once_in_order_inside_its_own_attention(case) -> None:
    lengths, L, open_rows = case
    rows, examples, builder = build(lengths, L, pack=True, open_rows=open_rows)
    seen = []
    for row in rows:
        tokens, loss = row["tokens"], row["loss_mask"].astype(bool)
        pos, seq = row["position_ids"], row["sequence_ids"]
        assert len(tokens) == len(loss) == len(pos) == len(seq) == L
        starts = np.flatnonzero(pos == 0)
        assert starts[0] == 0
        bounds = [*starts.tolist(), L]
        for a, b in zip(bounds, bounds[1:], strict=False):
            assert (pos[a:b] == np.arange(b - a)).all()  # positions count from each example's start
            assert len(set(seq[a:b].tolist())) == 1  # one sequence id per example
            assert not loss[a]  # no target predicted from the example before
            if seq[a] == PAD_SEQUENCE:
                assert b == L and (tokens[a:b] == PAD).all() and not loss[a:b].any()
            else:
                example = tokens[a:b]
                seen.append(int(example[0]) // 1000 - 1)
                assert (example == examples[seen[-1]]).all()  # whole, in order
                assert loss[a + 1:b].all()
        real = seq[seq != PAD_SEQUENCE]
        assert (np.diff(real) == 1).sum() == len(set(real.tolist())) - 1  # ids 0, 1, 2... in row order
    assert sorted(seen) == list(range(len(lengths)))  # every example exactly once
    padding = len(rows) * L - sum(lengths)
    assert builder.padding_tokens == padding and builder.written == len(rows)
    if open_rows == 1:  # plain greedy keeps the input order across rows too
        assert seen == list(range(len(lengths)))


@settings(max_examples=60, deadline=None)
@given(lengths_and_len)
def test_padded_rows_hold_one_example_each(case) -> None:
    lengths, L, _ = case
    rows, examples, builder = build(lengths, L, pack=False)
    assert len(rows) == len(lengths)
    for row, example in zip(rows, examples, strict=True):
        n = len(example)
        assert (row["tokens"][:n] == example).all() and (row["tokens"][n:] == PAD).all()
        assert row["attention_mask"].tolist() == [1] * n + [0] * (L - n)
        assert not row["loss_mask"][0] and row["loss_mask"][1:n].all() and not row["loss_mask"][n:].any()
    assert builder.padding_tokens == len(rows) * L - sum(lengths)


def test_batch_labels_and_padding_share() -> None:
    rows, _, _ = build([3, 2, 4], 6, pack=True, open_rows=1)  # [3 2 pad1] [4 pad2]
    collate = ExampleBatch(packed=True)
    batch = collate({k: np.stack([r[k] for r in rows]) for k in collate.columns})
    assert batch["labels"][0].tolist() == [-100, 1001, 1002, -100, 2001, -100]
    assert batch["sequence_ids"][1].tolist() == [0, 0, 0, 0, -1, -1]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 0]
    assert all(v.dtype == torch.int64 for v in batch.values())
    assert padding_share(batch) == 3 / 12
    padded = build([3, 5], 6, pack=False)[0]
    collate = ExampleBatch(packed=False)
    batch = collate({k: [r[k] for r in padded] for k in collate.columns})  # lists, as variable columns come
    assert padding_share(batch) == 4 / 12 and "position_ids" not in batch
