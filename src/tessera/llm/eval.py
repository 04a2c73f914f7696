"""Evaluation: perplexity on held-out token windows, and multiple-choice in-context tasks.

    ppl = perplexity(model, mds_batches("s3://bucket/data", split="val", batch_size=8))
    task = load_mc_task("tiny_mc")                  # shipped with the package, or a path to a JSONL file
    result = evaluate_multiple_choice(task, ModelScorer(model, tokenizer), num_fewshot=2)

Multiple-choice tasks use LLM Foundry's ICL format, one JSON object per line:
`{"query": "2 + 2 =", "choices": ["3", "4", "5"], "gold": 1}`. Each item is asked after `num_fewshot`
solved examples drawn (seeded, per item) from the rest of the task:

    <query_a> <gold choice of a>\\n<query_b> <gold choice of b>\\n<query> <choice>

and the choice the scorer rates highest wins. `ModelScorer` rates a choice by the mean log-likelihood
per token of its continuation (Foundry's choice: no bias towards short answers), or the sum.

This is the quick check `tessera llm eval --task` runs, with a pluggable scorer. The four task types of
LLM Foundry (language modelling, multiple choice, schema, question answering), with Foundry's exact
few-shot prompts, rank-sharded scoring and the recipe's `icl_tasks`, are `tessera.llm.icl`.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from tessera.llm.icl.scoring import score_continuations
from tessera.llm.tokenizer import Tokenizer

# --- perplexity ----------------------------------------------------------------------------------------


@dataclass
class PerplexityResult:
    loss: float          # mean next-token cross-entropy (nats per token)
    perplexity: float
    tokens: int          # predictions scored
    batches: int


def mds_batches(url: str | os.PathLike[str], split: str | None = "val", batch_size: int = 8,
                max_batches: int | None = None) -> Iterator[dict[str, Any]]:
    """{"tokens": [B, L]} batches of an MDS split, in order (the last batch may be smaller); LLM Foundry's
    token columns (ndarray:int32, bytes of int64) come as int64 tensors (llm/tokens.py)."""
    from tessera.llm.tokens import token_collate, tokens_encoding
    from tessera.shards import MDSDataset

    with MDSDataset(url, split=split, columns=["tokens"]) as ds:
        if len(ds) == 0:
            raise ValueError(f"{ds.store.url}: the split has no samples; prep more text or raise --val-fraction")
        collate = token_collate([(ds.store.url, tokens_encoding(ds.index.shards))], None)
        for n, start in enumerate(range(0, len(ds), batch_size)):
            if max_batches is not None and n >= max_batches:
                return
            batch = ds.get_batch(slice(start, min(start + batch_size, len(ds))))
            yield collate(batch) if collate else batch


@torch.no_grad()
def perplexity(model: torch.nn.Module, batches: Iterable[dict[str, Any]],
               device: torch.device | str | None = None) -> PerplexityResult:
    """Token-weighted mean loss and its exp over batches of {"tokens": [B, L]} (arrays or tensors)."""
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    total, count, n = 0.0, 0, 0
    try:
        for n, batch in enumerate(batches, 1):  # noqa: B007
            tokens = batch["tokens"]
            tokens = (tokens if isinstance(tokens, torch.Tensor) else torch.as_tensor(np.asarray(tokens, np.int64)))
            tokens = tokens.to(device=device, dtype=torch.long)
            logits = model(tokens[:, :-1]).float()
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1),
                                     reduction="sum").item()
            count += tokens[:, 1:].numel()
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("no batches to evaluate")
    loss = total / count
    return PerplexityResult(loss=loss, perplexity=math.exp(min(loss, 700.0)), tokens=count, batches=n)


# --- multiple choice (LLM Foundry ICL format) -------------------------------------------------------


@dataclass(frozen=True)
class MCItem:
    query: str
    choices: tuple[str, ...]
    gold: int


def parse_mc_lines(lines: Iterable[str], label: str) -> list[MCItem]:
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            query, choices, gold = obj["query"], obj["choices"], obj["gold"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{label}:{number}: expected {{\"query\": str, \"choices\": [str, ...], "
                             f"\"gold\": int}} ({exc})") from None
        if not (isinstance(query, str) and isinstance(choices, list) and len(choices) >= 2
                and all(isinstance(c, str) for c in choices)):
            raise ValueError(f"{label}:{number}: query must be text and choices a list of at least 2 texts")
        if not isinstance(gold, int) or not 0 <= gold < len(choices):
            raise ValueError(f"{label}:{number}: gold must index choices (0..{len(choices) - 1}), got {gold!r}")
        items.append(MCItem(query, tuple(choices), gold))
    if not items:
        raise ValueError(f"{label}: no items")
    return items


def load_mc_task(name_or_path: str | os.PathLike[str]) -> list[MCItem]:
    """Items of a JSONL task file, or of a task shipped in tessera/llm/tasks/ by name ("tiny_mc")."""
    path = Path(name_or_path)
    if path.is_file():
        return parse_mc_lines(path.read_text(encoding="utf-8").splitlines(), str(path))
    shipped = resources.files("tessera.llm") / "tasks" / f"{path.name}.jsonl"
    if shipped.is_file():
        return parse_mc_lines(shipped.read_text(encoding="utf-8").splitlines(), f"tasks/{path.name}.jsonl")
    names = sorted(p.name.removesuffix(".jsonl") for p in (resources.files("tessera.llm") / "tasks").iterdir()
                   if p.name.endswith(".jsonl"))
    raise FileNotFoundError(f"{name_or_path}: no such task file or shipped task (shipped: {', '.join(names)})")


def fewshot_context(items: Sequence[MCItem], index: int, num_fewshot: int, seed: int = 1234,
                    continuation_delimiter: str = " ", example_delimiter: str = "\n") -> str:
    """The prompt for item `index`: solved examples from the other items, then its query."""
    rng = random.Random(seed * 1_000_003 + index)
    others = [i for i in range(len(items)) if i != index]
    shots = rng.sample(others, min(num_fewshot, len(others)))
    parts = [items[i].query + continuation_delimiter + items[i].choices[items[i].gold] for i in shots]
    return example_delimiter.join([*parts, items[index].query + continuation_delimiter])


class Scorer(Protocol):
    def __call__(self, context: str, continuations: Sequence[str]) -> list[float]:
        """A score per continuation given the context; higher means more likely."""
        ...


@dataclass
class MCResult:
    accuracy: float
    items: int
    correct: list[bool] = field(repr=False)


def evaluate_multiple_choice(items: Sequence[MCItem], scorer: Scorer, num_fewshot: int = 0, seed: int = 1234,
                             continuation_delimiter: str = " ", example_delimiter: str = "\n") -> MCResult:
    """Accuracy of `scorer` on the items, each asked after `num_fewshot` solved examples."""
    correct = []
    for i, item in enumerate(items):
        context = fewshot_context(items, i, num_fewshot, seed, continuation_delimiter, example_delimiter)
        scores = scorer(context, item.choices)
        correct.append(int(np.argmax(scores)) == item.gold)
    return MCResult(accuracy=sum(correct) / len(correct), items=len(correct), correct=correct)


class ModelScorer:
    """Log-likelihood of each continuation under the model, mean per token (default) or summed.

    A space ending the context moves to the front of the continuation, so " Paris" is tokenized the way
    it appears in running text. Contexts longer than the model's window lose their oldest tokens.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, reduction: str = "mean") -> None:
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        self.model, self.tokenizer, self.reduction = model, tokenizer, reduction

    @torch.no_grad()
    def __call__(self, context: str, continuations: Sequence[str]) -> list[float]:
        stripped = context.rstrip(" ")
        moved = context[len(stripped):]
        ctx = self.tokenizer.encode(stripped)
        conts = [self.tokenizer.encode(moved + c) or [self.tokenizer.eos_id] for c in continuations]
        max_len = self.model.cfg.max_seq_len
        contexts, scored = [], []
        for cont in conts:
            seq = (ctx + cont)[-max_len:]
            start = max(len(seq) - len(cont), 1)  # the first token has nothing before it to predict it
            contexts.append(seq[:start])
            scored.append(seq[start:])
        was_training = self.model.training
        self.model.eval()
        try:
            scores = score_continuations(self.model, contexts, scored, 0, next(self.model.parameters()).device)
        finally:
            self.model.train(was_training)
        return [s.mean_logprob if self.reduction == "mean" else s.sum_logprob for s in scores]
