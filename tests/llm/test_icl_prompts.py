"""ICL prompts as LLM Foundry builds them: few-shot draws, exact prompt strings per task type, tokens."""

from __future__ import annotations

import json
import random
import re

import pytest

from tessera.llm.icl.config import ICLTaskConfig
from tessera.llm.icl.items import LMItem, MCItem, QAItem, SchemaItem, TaskFileError, load_items, parse_lines
from tessera.llm.icl.prompts import (
    TokenizerView,
    build_prompts,
    fewshot_indices,
    max_answer_tokens,
    tokenize_prompt,
)
from tessera.llm.tokenizer import ByteTokenizer


def cfg(kind: str, **kw) -> ICLTaskConfig:
    return ICLTaskConfig(label="t", dataset_uri="unused", icl_task_type=kind, **kw)


def test_fewshot_draws_are_foundrys():
    """The same draws as Foundry's own test: one generator consumed call after call."""
    rng = random.Random(1234)
    assert set(fewshot_indices(5, 4, 4, rng)) == {0, 1, 2, 3}
    assert set(fewshot_indices(5, 5, 4, rng)) == {0, 1, 2, 3}
    assert set(fewshot_indices(5, 500, 4, rng)) == {0, 1, 2, 3}
    seven = fewshot_indices(10, 7, 4, rng)
    assert len(set(seven)) == 7 and 4 not in seven
    a, b, c = random.Random(1234), random.Random(1234), random.Random(11)
    assert fewshot_indices(10_000, 5, 1, a) == fewshot_indices(10_000, 5, 1, b) != fewshot_indices(10_000, 5, 1, c)


@pytest.mark.parametrize("size", [2, 3, 7, 40])
def test_fewshot_never_shows_the_item_itself(size):
    rng = random.Random(0)
    for index in range(size):
        for k in (1, 3, 50):
            shots = fewshot_indices(size, k, index, rng)
            assert index not in shots and len(set(shots)) == len(shots) == min(k, size - 1)


MC = [MCItem("2 + 2 =", ("3", "4"), 1), MCItem("3 + 3 =", ("6", "7"), 0), MCItem("1 + 0 =", ("0", "1"), 1)]


def test_multiple_choice_prompt_strings():
    zero = build_prompts(MC, cfg("multiple_choice"), 0)
    assert zero[0].preamble == "" and zero[0].contexts == ("2 + 2 =", "2 + 2 =") and zero[0].continuations == ("3", "4")
    two = build_prompts(MC, cfg("multiple_choice", prompt_string="Sums."), 2)
    # item 0: the other two items in the set order Foundry writes them, each after the example delimiter
    assert two[0].preamble == "Sums.\n3 + 3 = 6\n1 + 0 = 1"
    assert two[0].contexts[0] == "\n2 + 2 =" and two[0].gold == 1
    assert all(p.preamble.count("\n") == 2 for p in two)
    assert build_prompts(MC, cfg("multiple_choice", prompt_string="Sums."), 2) == two  # deterministic


def test_delimiters_prelimiter_and_answer_placement():
    c = cfg("language_modeling", continuation_delimiter="\nSpell: ", example_delimiter="\n\n",
            question_prelimiter="Orbs: ")
    items = [LMItem("quas quas exort", "ice wall"), LMItem("wex wex wex", "emp")]
    first, second = build_prompts(items, c, 1)
    assert first.preamble == "Orbs: wex wex wex\nSpell: emp"
    assert first.contexts == ("\n\nOrbs: quas quas exort\nSpell:",)  # right-stripped: the answer brings its space
    assert first.continuations == ("ice wall",)
    assert second.preamble == "Orbs: quas quas exort\nSpell: ice wall"
    alone = build_prompts(items, c, 0)[0]
    assert alone.preamble == "" and alone.contexts == ("Orbs: quas quas exort\nSpell:",)


def test_schema_contexts_and_solved_examples():
    items = [SchemaItem(("cont one", "cont two"), "this is a continuation", 0),
             SchemaItem(("other a", "other b"), "ends here", 1)]
    for pre in ("", "This is a question: "):
        c = cfg("schema", continuation_delimiter=" ### ", question_prelimiter=pre)
        zero = build_prompts(items, c, 0)[0]
        assert zero.contexts == (f"{pre}cont one", f"{pre}cont two") and zero.gold == 0
        assert zero.continuations == ("this is a continuation",) * 2
        one = build_prompts(items, c, 1)[0]
        assert one.preamble == f"{pre}other b ### ends here"
        assert one.contexts == (f"{pre}\ncont one ###", f"{pre}\ncont two ###")


def test_question_answering_prompt_and_chain_of_thought():
    items = [QAItem("Q: 1+1?\nA:", "2", ("2", "two")), QAItem("Q: 2+2?\nA:", "4", ("4", "four"))]
    first = build_prompts(items, cfg("question_answering"), 1)[0]
    assert first.preamble == "Q: 2+2?\nA: 4" and first.contexts == ("\nQ: 1+1?\nA:",)
    assert first.answers == ("2", "two")
    cot = [QAItem("Q: 1+1?", "2", ("2",), "one and one make"), QAItem("Q: 2+2?", "4", ("4",), "two twos make")]
    shot = build_prompts(cot, cfg("question_answering", cot_delimiter=" so: "), 1)[0]
    assert shot.preamble == "Q: 2+2? two twos make so: 4"
    tok = TokenizerView(ByteTokenizer())
    assert max_answer_tokens(cot, tok, " so: ") == len("one and one make so: 2") + 10


def test_tokens_put_the_space_on_the_answer_and_trim_from_the_left():
    tok = TokenizerView(ByteTokenizer())
    assert tok.prefix_space  # bytes join as written, so the answer carries the space the context lost
    prompt = build_prompts(MC, cfg("multiple_choice"), 2)[0]
    rows = tokenize_prompt(prompt, tok, max_len=1000)
    text = tok.decode(rows.contexts[1] + rows.continuations[1])
    assert text == prompt.preamble + prompt.contexts[1] + " 4"
    short = tokenize_prompt(prompt, tok, max_len=12)
    assert len(short.contexts[1]) + len(short.continuations[1]) == 12
    assert tok.decode(short.contexts[1] + short.continuations[1]) == text[-12:]
    with pytest.raises(ValueError, match="does not fit"):
        tokenize_prompt(prompt, tok, max_len=2)


def test_empty_context_starts_from_the_end_of_text_token():
    tok = TokenizerView(ByteTokenizer())
    rows = tokenize_prompt(build_prompts([LMItem("", "abc"), LMItem("", "d")], cfg("language_modeling"), 0)[0],
                           tok, 64)
    assert rows.contexts[0] == (tok.eos_id,)


def test_task_files_are_checked_line_by_line(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"query": "q", "choices": ["a", "b"], "gold": 1}) + "\n"
                    + json.dumps({"query": "q", "choices": ["a", "b"], "gold": 2}) + "\n")
    with pytest.raises(TaskFileError, match=r"mc\.jsonl:2: .*'gold' must index the options"):
        load_items(str(path), "multiple_choice")
    with pytest.raises(TaskFileError, match=r"x:1: a schema item is .*missing key 'context_options'"):
        parse_lines(['{"continuation": "c", "gold": 0}'], "schema", "x")
    with pytest.raises(FileNotFoundError, match="shipped: .*tiny_lm"):
        load_items("no_such_task", "language_modeling")
    # text is stripped as Foundry's loader strips it; list entries are kept as written
    (item,) = parse_lines(['{"query": " q ", "choices": [" a", "b "], "gold": 0}'], "multiple_choice", "x")
    assert item == MCItem("q", (" a", "b "), 0)


@pytest.mark.parametrize(("name", "kind"), [("tiny_lm", "language_modeling"), ("tiny_mc", "multiple_choice"),
                                            ("tiny_schema", "schema"), ("tiny_qa", "question_answering")])
def test_shipped_tasks_parse(name, kind):
    assert len(load_items(name, kind)) >= 20


class WordPieces:
    """A transformers-like tokenizer over whole words: with `implicit_space` each word carries its own
    leading space as sentencepiece's do (decoding joins words with spaces; a space before the first word
    is a piece of its own, as in Llama's), else spaces are tokens."""

    eos_token_id, pad_token_id = 0, None

    def __init__(self, implicit_space: bool) -> None:
        self.implicit, self.vocab = implicit_space, ["</s>"]

    def _id(self, piece: str) -> int:
        if piece not in self.vocab:
            self.vocab.append(piece)
        return self.vocab.index(piece)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        if self.implicit:
            lead = ["\u2581"] if text.startswith(" ") else []
            return {"input_ids": [self._id(w) for w in lead + text.split()]}
        return {"input_ids": [self._id(p) for p in re.findall(r" |[^ ]+", text)]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        pieces = [self.vocab[i] for i in ids]
        return " ".join(pieces) if self.implicit else "".join(pieces)

    def convert_ids_to_tokens(self, ids):
        return [self.vocab[i] for i in ids]


def test_the_answer_space_follows_the_tokenizer():
    assert not TokenizerView(WordPieces(implicit_space=True)).prefix_space  # sentencepiece adds it itself
    assert TokenizerView(WordPieces(implicit_space=False)).prefix_space
    tok = TokenizerView(WordPieces(implicit_space=True))
    assert tok.answer("Paris") == "Paris" and tok.pad_id == tok.eos_id == 0
