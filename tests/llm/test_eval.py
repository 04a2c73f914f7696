"""Evaluation: perplexity over an MDS split, multiple-choice ICL scoring (model and oracle)."""

from __future__ import annotations

import math

import pytest
import torch
from llm_helpers import small_model

from tessera.llm.eval import (
    MCItem,
    ModelScorer,
    evaluate_multiple_choice,
    fewshot_context,
    load_mc_task,
    mds_batches,
    parse_mc_lines,
    perplexity,
)
from tessera.llm.tokenizer import ByteTokenizer
from tessera.shards import MDSDataset


def test_perplexity_matches_the_model_loss(prepped):
    model = small_model()
    result = perplexity(model, mds_batches(prepped, "val", batch_size=3))
    with MDSDataset(prepped, split="val") as ds:
        tokens = torch.as_tensor(ds.get_batch(slice(0, len(ds)))["tokens"].astype("int64"))
    assert result.tokens == tokens.shape[0] * 31 and result.batches == math.ceil(tokens.shape[0] / 3)
    assert result.loss == pytest.approx(model({"tokens": tokens}).item(), rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(result.loss))
    assert 100 < result.perplexity < 1000  # an untrained model is near uniform over 257 tokens
    assert perplexity(model, mds_batches(prepped, "val", batch_size=2, max_batches=1)).batches == 1


def test_shipped_task_and_model_accuracy_in_range():
    items = load_mc_task("tiny_mc")
    assert len(items) >= 20 and all(0 <= it.gold < len(it.choices) for it in items)
    scorer = ModelScorer(small_model(max_seq_len=256), ByteTokenizer())
    for shots in (0, 2):
        result = evaluate_multiple_choice(items, scorer, num_fewshot=shots)
        assert 0.0 <= result.accuracy <= 1.0 and result.items == len(items)


class OracleScorer:
    """Knows every answer: finds which item the context ends with and scores its gold choice highest."""

    def __init__(self, items):
        self.answers = {it.query: it.choices[it.gold] for it in items}

    def __call__(self, context, continuations):
        query = next(q for q in self.answers if context.endswith(q + " "))
        return [1.0 if c == self.answers[query] else 0.0 for c in continuations]


def test_oracle_scorer_gets_everything_right():
    items = load_mc_task("tiny_mc")
    for shots in (0, 3):
        assert evaluate_multiple_choice(items, OracleScorer(items), num_fewshot=shots).accuracy == 1.0
    contrarian = lambda context, conts: [-s for s in OracleScorer(items)(context, conts)]  # noqa: E731
    assert evaluate_multiple_choice(items, contrarian).accuracy == 0.0


def test_fewshot_context_is_seeded_and_never_shows_the_answer():
    items = [MCItem(f"q{i} =", (f"a{i}", f"b{i}"), i % 2) for i in range(10)]
    ctx = fewshot_context(items, 4, num_fewshot=3)
    assert ctx == fewshot_context(items, 4, num_fewshot=3)
    lines = ctx.split("\n")
    assert len(lines) == 4 and lines[-1] == "q4 = "
    assert "q4" not in "\n".join(lines[:-1])
    for line in lines[:-1]:
        i = int(line.split()[0][1:])
        assert line == f"q{i} = {items[i].choices[items[i].gold]}"


def test_model_scorer_mean_and_sum_are_continuation_log_likelihoods():
    model, tok = small_model(seed=2), ByteTokenizer()
    context, choices = "2 + 2 = ", ["4", "four"]
    mean = ModelScorer(model, tok, "mean")(context, choices)
    total = ModelScorer(model, tok, "sum")(context, choices)
    for choice, m, s in zip(choices, mean, total, strict=True):
        ids = tok.encode("2 + 2 =") + tok.encode(" " + choice)  # the context's space moves to the choice
        logp = torch.log_softmax(model(torch.tensor([ids])), -1)[0]
        n = len(choice) + 1
        want = sum(logp[len(ids) - n - 1 + j, ids[len(ids) - n + j]].item() for j in range(n))
        assert s == pytest.approx(want, abs=1e-4) and m == pytest.approx(want / n, abs=1e-5)


def test_task_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"query": "a", "choices": ["x", "y"], "gold": 0}\n{"query": "b", "choices": ["x"], "gold": 0}\n')
    with pytest.raises(ValueError, match="t.jsonl:2"):
        load_mc_task(bad)
    with pytest.raises(ValueError, match="gold must index"):
        parse_mc_lines(['{"query": "a", "choices": ["x", "y"], "gold": 2}'], "x")
    with pytest.raises(FileNotFoundError, match="tiny_mc"):
        load_mc_task("no_such_task")


def test_perplexity_over_a_streaming_dataloader(prepped):
    from tessera.stream import StreamingDataLoader, StreamingDataset

    model = small_model()
    ds = StreamingDataset(local=str(prepped), split="val", batch_size=1)
    streamed = perplexity(model, StreamingDataLoader(ds, batch_size=1, num_workers=0))
    direct = perplexity(model, mds_batches(prepped, "val", batch_size=4))
    assert streamed.tokens == direct.tokens
    assert streamed.loss == pytest.approx(direct.loss, rel=1e-5)
