"""Few-shot prompts as LLM Foundry builds them, then token rows ready for a model.

For item i, `num_fewshot` other items are drawn (one `random.Random(fewshot_random_seed)` consumed item
by item in file order, the same draw Foundry makes, so prompts match Foundry's and every rank builds the
same ones) and written as solved examples after `prompt_string`:

    <prompt_string><prelimiter><ctx_a><continuation_delimiter><answer_a><example_delimiter>...
        <prelimiter><ctx_i><continuation_delimiter>            (right-stripped; the answer is scored after it)

The preamble (prompt + examples) and the item's own context are tokenized apart, the preamble with the
tokenizer's special tokens (a BOS) and a trailing EOS removed, the context and the answer without; the
answer gets a leading space when the tokenizer does not add one itself. Schema items (Winograd) swap
the roles: each option is a context and the shared continuation is scored after each.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tessera.llm.icl.config import ICLTaskConfig
from tessera.llm.icl.items import Item, LMItem, MCItem, QAItem, SchemaItem


class TokenizerView:
    """encode/decode over Tessera's tokenizers and transformers' ones alike."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.is_hf = hasattr(tokenizer, "convert_ids_to_tokens")
        eos = getattr(tokenizer, "eos_token_id", None) if self.is_hf else tokenizer.eos_id
        self.eos_id: int | None = eos
        pad = getattr(tokenizer, "pad_token_id", None) if self.is_hf else None
        self.pad_id = pad if pad is not None else (eos if eos is not None else 0)
        self.prefix_space = self._needs_prefix_space()

    def encode(self, text: str, special: bool = False) -> list[int]:
        if self.is_hf:
            return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        if self.is_hf:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return self.tokenizer.decode(list(ids))

    def _needs_prefix_space(self) -> bool:
        """Foundry's test (GPT-2 style BPE encodes " a" as one token), widened to byte-level tokenizers
        that join pieces as written; sentencepiece adds the space itself ("x" + "y" decodes as "x y")."""
        if len(self.encode(" a")) == 1:
            return True
        return self.decode(self.encode("x") + self.encode("y")) == "xy"

    def answer(self, text: str) -> str:
        return f" {text}" if self.prefix_space and not text.startswith(" ") else text


@dataclass(frozen=True)
class PromptText:
    """An item's prompt as text: the preamble, then one context per option, each followed by its
    continuation (language modelling and question answering have one option; `gold` is its index)."""

    preamble: str
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int = 0
    answers: tuple[str, ...] = ()  # question answering: any of these is right


@dataclass(frozen=True)
class Prompted:
    """An item as token rows: for each option, its context and the continuation scored after it."""

    contexts: tuple[tuple[int, ...], ...]
    continuations: tuple[tuple[int, ...], ...]
    gold: int = 0
    answers: tuple[str, ...] = ()


def fewshot_indices(size: int, num_fewshot: int, index: int, rng: random.Random) -> list[int]:
    """`num_fewshot` distinct items other than `index` (fewer when the task is smaller), drawn as Foundry
    draws them: a sample of all items and, when it caught `index`, one redraw in its place."""
    count = min(size - 1, num_fewshot)
    chosen = set(rng.sample(range(size), count))
    if index in chosen:
        chosen.discard(index)
        if len(chosen) < size - 1:
            pick = rng.choice(range(size))
            while pick in chosen or pick == index:
                pick = rng.choice(range(size))
            chosen.add(pick)
    return list(chosen)  # a set's order, which is the order Foundry writes them in


def _has_cot(items: Sequence[Item]) -> bool:
    return any(isinstance(it, QAItem) and it.chain_of_thought for it in items)


def _solved(item: Item, cfg: ICLTaskConfig, preceding: str, cot: bool) -> str:
    """An item written as a solved example after `preceding` text."""
    if isinstance(item, SchemaItem):
        head = cfg.example_delimiter if preceding else ""
        return f"{cfg.question_prelimiter}{head}{item.context_options[item.gold]}" \
               f"{cfg.continuation_delimiter}{item.continuation}"
    return _context(item, cfg, preceding) + _answer_text(item, cfg, cot)


def _context(item: LMItem | MCItem | QAItem, cfg: ICLTaskConfig, preceding: str) -> str:
    text = item.query if isinstance(item, MCItem) else item.context
    head = cfg.example_delimiter if preceding else ""
    return f"{head}{cfg.question_prelimiter}{text}{cfg.continuation_delimiter}"


def _answer_text(item: LMItem | MCItem | QAItem, cfg: ICLTaskConfig, cot: bool) -> str:
    if isinstance(item, LMItem):
        return item.continuation
    if isinstance(item, MCItem):
        return item.choices[item.gold]
    return f"{item.chain_of_thought}{cfg.cot_delimiter}{item.answer}" if cot else item.answer


def build_prompts(items: Sequence[Item], cfg: ICLTaskConfig, num_fewshot: int) -> list[PromptText]:
    """Every item's prompt, in file order (the few-shot draws depend on it)."""
    rng = random.Random(cfg.fewshot_random_seed)
    cot = _has_cot(items)
    prompts = []
    for index, item in enumerate(items):
        preamble = cfg.prompt_string
        if num_fewshot > 0:
            for shot in fewshot_indices(len(items), num_fewshot, index, rng):
                preamble += _solved(items[shot], cfg, preamble, cot)
        prompts.append(_item_prompt(item, cfg, preamble))
    return prompts


def _item_prompt(item: Item, cfg: ICLTaskConfig, preamble: str) -> PromptText:
    if isinstance(item, SchemaItem):
        if preamble:
            delimiter = cfg.continuation_delimiter.rstrip()
            contexts = tuple(f"{cfg.question_prelimiter}{cfg.example_delimiter}{c}{delimiter}"
                             for c in item.context_options)
        else:
            contexts = tuple(f"{cfg.question_prelimiter}{c}" for c in item.context_options)
        return PromptText(preamble, contexts, (item.continuation,) * len(contexts), item.gold)
    context = _context(item, cfg, preamble).rstrip()
    if isinstance(item, MCItem):
        return PromptText(preamble, (context,) * len(item.choices), item.choices, item.gold)
    if isinstance(item, LMItem):
        return PromptText(preamble, (context,), (item.continuation,))
    return PromptText(preamble, (context,), ("",), answers=item.aliases)


def _trim(context: list[int], continuation: list[int], max_len: int, what: str) -> tuple[int, ...]:
    """The context cut from the left so context + continuation fits `max_len` (Foundry's rule)."""
    room = max_len - len(continuation)
    if room < 1:
        raise ValueError(f"{what}: an answer of {len(continuation)} tokens does not fit max_seq_len={max_len}")
    return tuple(context[-room:])


def tokenize_prompt(prompt: PromptText, tok: TokenizerView, max_len: int, what: str = "icl task") -> Prompted:
    """Token rows of a prompt, each context trimmed to fit `max_len` with its continuation."""
    preamble = tok.encode(prompt.preamble, special=True)
    if len(preamble) > 1 and tok.eos_id is not None and preamble[-1] == tok.eos_id:
        preamble = preamble[:-1]
    contexts, continuations = [], []
    for context, continuation in zip(prompt.contexts, prompt.continuations, strict=True):
        ids = preamble + tok.encode(context)
        if not ids:  # nothing to predict the first token from: start from the end-of-text token
            ids = [tok.eos_id if tok.eos_id is not None else tok.pad_id]
        cont = tok.encode(tok.answer(continuation)) if continuation else []
        contexts.append(_trim(ids, cont, max_len, what))
        continuations.append(tuple(cont))
    return Prompted(tuple(contexts), tuple(continuations), prompt.gold, prompt.answers)


def max_answer_tokens(items: Sequence[Item], tok: TokenizerView, cot_delimiter: str) -> int:
    """Tokens to generate for question answering: the longest answer or alias (Foundry's count, with its
    special tokens), plus 10 when answers follow a chain of thought."""
    cot = _has_cot(items)
    longest = 0
    for item in items:
        if isinstance(item, QAItem):
            for answer in item.aliases:
                text = f"{item.chain_of_thought}{cot_delimiter}{answer}" if cot else answer
                longest = max(longest, len(tok.encode(text, special=True)))
    return max(longest + (10 if cot_delimiter else 0), 1)
