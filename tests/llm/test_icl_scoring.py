"""ICL scoring picks the right answers when the model knows them: a "model" that has memorised token
sequences (the gold prompt + answer of every item) must score 100%, one that memorised a wrong option 0%.
Also Foundry's answer normalisation, the gauntlet average, and the rank split of the counts."""

from __future__ import annotations

import math

import pytest
import torch

from tessera.llm.icl.config import GauntletConfig, ICLSection, ICLTaskConfig
from tessera.llm.icl.gauntlet import aggregate
from tessera.llm.icl.items import load_items
from tessera.llm.icl.prompts import TokenizerView
from tessera.llm.icl.runner import evaluate_icl, prepare_tasks, score_task
from tessera.llm.icl.scoring import answer_is_right, greedy_generate, normalize_answer
from tessera.llm.tokenizer import ByteTokenizer

VOCAB = 257


class Memorised:
    """logits(ids): at each position, a large logit on the token that follows this exact prefix in one of
    the memorised sequences; flat logits where the prefix is in none of them."""

    def __init__(self, sequences):
        self.next = {}
        for seq in sequences:
            for t in range(1, len(seq)):
                self.next.setdefault(tuple(seq[:t]), seq[t])

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*ids.shape, VOCAB)
        for b, row in enumerate(ids.tolist()):
            for t in range(len(row)):
                token = self.next.get(tuple(row[:t + 1]))
                if token is not None:
                    out[b, t, token] = 20.0
        return out


def tasks(shots=(0, 2), **kw):
    section = ICLSection.model_validate({"icl_tasks": [
        {"label": kind, "dataset_uri": f"tiny_{kind}", "icl_task_type": t, "num_fewshot": list(shots), **kw}
        for kind, t in (("lm", "language_modeling"), ("mc", "multiple_choice"), ("schema", "schema"),
                        ("qa", "question_answering"))]})
    return prepare_tasks(section.icl_tasks, ByteTokenizer(), max_seq_len=512)


def memorised(prepared, pick=lambda p: p.gold):
    """The sequences a model would have to know to answer every item with option `pick(prompt)`."""
    eos = ByteTokenizer().eos_id
    seqs = []
    for task in prepared:
        for p in task.prompts:
            i = pick(p) % len(p.contexts)
            if task.cfg.icl_task_type == "question_answering":
                answer = ByteTokenizer().encode(" " + p.answers[0])
                seqs.append(list(p.contexts[0]) + answer + [eos])
            else:
                seqs.append(list(p.contexts[i]) + list(p.continuations[i]))
    return seqs


def test_a_model_that_knows_the_answers_scores_everything_right():
    prepared = tasks()
    metrics = evaluate_icl(prepared, Memorised(memorised(prepared)), ByteTokenizer())
    assert {k: v for k, v in metrics.items()} == {**{f"icl/{t.key}": 1.0 for t in prepared}, "icl/average": 1.0}


def test_a_model_that_knows_wrong_options_scores_nothing_on_choices():
    prepared = [t for t in tasks() if t.cfg.icl_task_type in ("multiple_choice", "schema")]
    metrics = evaluate_icl(prepared, Memorised(memorised(prepared, pick=lambda p: p.gold + 1)), ByteTokenizer())
    assert all(metrics[f"icl/{t.key}"] == 0.0 for t in prepared)


def test_lm_accuracy_needs_every_continuation_token():
    """Knowing all but the last token of each continuation is wrong (LAMBADA-style exact greedy match).
    One shot count only: a 0-shot prompt is a prefix of 2-shot prompts that begin with it solved."""
    prepared = [t for t in tasks(shots=(0,)) if t.cfg.icl_task_type == "language_modeling"]
    cut = [seq[:-1] for seq in memorised(prepared)]
    assert evaluate_icl(prepared, Memorised(cut), ByteTokenizer())["icl/average"] == 0.0


def test_the_rank_shares_cover_every_item_once():
    prepared = tasks(shots=(1,))
    model, tok = Memorised(memorised(prepared)), TokenizerView(ByteTokenizer())
    for task in prepared:
        whole = score_task(task, model, tok, "cpu")
        shares = [score_task(task, model, tok, "cpu", rank=r, world_size=3) for r in range(3)]
        assert whole == (len(task.prompts), len(task.prompts))
        assert tuple(map(sum, zip(*shares, strict=True))) == whole
        capped = score_task(task, model, tok, "cpu", max_batches=1)
        assert capped[1] == min(task.items_per_batch, len(task.prompts))


def test_greedy_generation_reads_each_rows_own_end():
    """Rows of different lengths are right-padded; each continues from its own last token."""
    tok = ByteTokenizer()
    seqs = [tok.encode("ab: xyz") + [tok.eos_id], tok.encode("long prompt: q") + [tok.eos_id]]
    out = greedy_generate(Memorised(seqs), [tok.encode("ab:"), tok.encode("long prompt:")], 6, 0, tok.eos_id, "cpu")
    assert [tok.decode(o) for o in out] == [" xyz", " q"]
    fixed = greedy_generate(Memorised(seqs), [tok.encode("ab:")], 3, 0, tok.eos_id, "cpu", stop_early=False)
    assert tok.decode(fixed[0]) == " xy"


def test_answers_match_as_foundry_matches_them():
    assert normalize_answer("The  Eiffel_Tower!") == "eiffel tower"
    assert answer_is_right(" Paris, of course", ["paris"], None, "", True)  # a prefix match after normalising
    assert not answer_is_right(" Lyon", ["Paris", "paris"], None, "", True)
    assert answer_is_right(" 7\nQ: next", ["7"], ["\n"], "", False)
    assert answer_is_right(" 7x", ["7"], ["\n"], "", True)  # Foundry's match is a prefix match
    assert answer_is_right("two and two is four. The answer is 4", ["4"], None, "The answer is", False)
    assert not answer_is_right("so 5 (and not 4)", ["4"], ["("], "", True)


def test_gauntlet_average():
    scores = {"a/0-shot": (0.5, 100), "b/0-shot": (1.0, 4), "c/3-shot": (0.25, 16)}
    assert aggregate(scores, None) == {"icl/average": pytest.approx(1.75 / 3)}
    g = GauntletConfig.model_validate({"categories": [
        {"name": "easy", "benchmarks": [{"name": "a", "num_fewshot": 0, "random_baseline": 0.25},
                                        {"name": "b", "num_fewshot": 0, "random_baseline": 0.5}]},
        {"name": "hard", "benchmarks": [{"name": "c", "num_fewshot": 3}]},
        {"name": "missing", "benchmarks": [{"name": "d", "num_fewshot": 0}]}]})
    easy = ((0.5 - 0.25) / 0.75 + 1.0) / 2
    assert aggregate(scores, g) == {"icl/gauntlet/easy": pytest.approx(easy), "icl/gauntlet/hard": 0.25,
                                    "icl/average": pytest.approx((easy + 0.25) / 2)}
    by_size = aggregate(scores, g.model_copy(update={"weighting": "SAMPLE_SZ"}))
    assert by_size["icl/gauntlet/easy"] == pytest.approx(((0.25 / 0.75) * 100 + 1.0 * 4) / 104)
    logs = aggregate(scores, g.model_copy(update={"weighting": "LOG_SAMPLE_SZ"}))
    w = (math.log2(100), 2.0)
    assert logs["icl/gauntlet/easy"] == pytest.approx(((0.25 / 0.75) * w[0] + w[1]) / sum(w))


def test_items_are_read_from_a_bucket():
    from importlib import resources

    from tessera.storage import open_store

    shipped = resources.files("tessera.llm") / "tasks" / "tiny_mc.jsonl"
    open_store("memory://icl-test").put("tasks/mc.jsonl", shipped.read_bytes())
    assert load_items("memory://icl-test/tasks/mc.jsonl", "multiple_choice") == load_items("tiny_mc",
                                                                                         "multiple_choice")


def test_task_config_accepts_foundrys_names():
    task = ICLTaskConfig.model_validate({"label": "x", "dataset_uri": "y", "num_fewshot": 3,
                                         "icl_task_type": "generation_task_with_answers"})
    assert task.icl_task_type == "question_answering" and task.num_fewshot == [3]


def test_categories_are_tasks_of_their_own(tmp_path):
    """has_categories: each category draws its examples from itself and is logged apart; the task's score
    is the mean over its categories, whatever their sizes."""
    import json

    path = tmp_path / "cat.jsonl"
    rows = [{"context": f"{c} {i}:", "continuation": f"{c}{i}", "category": c} for c in "ab" for i in range(3 + 3 * (c == "b"))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = ICLTaskConfig(label="x", dataset_uri=str(path), icl_task_type="language_modeling", num_fewshot=[2],
                        has_categories=True)
    prepared = prepare_tasks([cfg], ByteTokenizer(), 256)
    assert [t.key for t in prepared] == ["x/2-shot/a", "x/2-shot/b"] and [len(t.prompts) for t in prepared] == [3, 6]
    tok = TokenizerView(ByteTokenizer())
    assert all(b"b" not in bytes(p.contexts[0]) for p in prepared[0].prompts)  # a's examples come from a
    only_a = [list(p.contexts[0]) + list(p.continuations[0]) for p in prepared[0].prompts]
    metrics = evaluate_icl(prepared, Memorised(only_a), tok)
    assert metrics == {"icl/x/2-shot/a": 1.0, "icl/x/2-shot/b": 0.0, "icl/x/2-shot": 0.5, "icl/average": 0.5}
    path.write_text(json.dumps({"context": "c", "continuation": "d"}) + "\n")
    with pytest.raises(ValueError, match=r"cat\.jsonl:1: has_categories needs a \"category\""):
        prepare_tasks([cfg], ByteTokenizer(), 256)


def test_a_foundry_tasks_file_validates_as_written(tmp_path):
    import yaml

    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump({"icl_tasks": [
        {"label": "gsm", "dataset_uri": "eval/gsm.jsonl", "num_fewshot": [0], "icl_task_type":
         "generation_task_with_answers", "cot_delimiter": "The answer is ", "continuation_delimiter": "\n\nA:",
         "question_prelimiter": "", "do_normalization": False, "early_stopping_criteria": ["\n\n", "Question:"]},
        {"label": "jeopardy", "dataset_uri": "eval/jeopardy.jsonl", "num_fewshot": [3],
         "icl_task_type": "language_modeling", "continuation_delimiter": "\nAnswer: ", "has_categories": True},
        {"label": "arc", "dataset_uri": "eval/arc.jsonl", "num_fewshot": [3, 25], "icl_task_type": "multiple_choice"},
        {"label": "wino", "dataset_uri": "eval/wino.jsonl", "num_fewshot": [5], "icl_task_type": "schema"}]}))
    section = ICLSection.model_validate({"icl_tasks": str(path)})
    assert [t.icl_task_type for t in section.icl_tasks] == ["question_answering", "language_modeling",
                                                           "multiple_choice", "schema"]
