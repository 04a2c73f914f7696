"""Score ICL tasks with a model on every rank, and agree on the numbers.

    tasks = prepare_tasks(section.icl_tasks, tokenizer, max_seq_len=model_seq_len(model))
    metrics = evaluate_icl(tasks, model, device="cpu")   # {"icl/lambada/0-shot": 0.41, ..., "icl/average": ...}

Prompts are built once (text and tokens) and reused at every evaluation. Each rank scores the items
i with i % world_size == rank, so the ranks share the work without overlap; the counts of right answers
are then summed over ranks, so every rank returns (and may log) the same numbers. Every rank runs the
same number of forward passes (a rank short of items scores a stand-in batch it does not count), which
a sharded model (FSDP) needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tessera.llm.icl.config import GauntletConfig, ICLTaskConfig
from tessera.llm.icl.gauntlet import aggregate
from tessera.llm.icl.items import load_categories, load_items
from tessera.llm.icl.prompts import (
    Prompted,
    TokenizerView,
    build_prompts,
    max_answer_tokens,
    tokenize_prompt,
)
from tessera.llm.icl.scoring import (
    LogitsFn,
    answer_is_right,
    greedy_generate,
    logits_fn,
    score_continuations,
)
from tessera.train.distributed import all_reduce_


@dataclass
class PreparedTask:
    """One task at one shot count, tokenized."""

    cfg: ICLTaskConfig
    num_fewshot: int
    prompts: list[Prompted]
    max_new_tokens: int = 0  # question answering
    category: str | None = None  # has_categories: the items of this category only

    @property
    def name(self) -> str:
        """What the task is reported as: `<label>/<n>-shot` (its categories' mean, with categories)."""
        return f"{self.cfg.label}/{self.num_fewshot}-shot"

    @property
    def key(self) -> str:
        return self.name if self.category is None else f"{self.name}/{self.category}"

    @property
    def items_per_batch(self) -> int:
        """Foundry's batch_size counts rows: a multiple-choice item of N options takes N of them."""
        options = len(self.prompts[0].contexts)
        return max(self.cfg.batch_size // options, 1)


def prepare_tasks(tasks: Sequence[ICLTaskConfig], tokenizer: Any, max_seq_len: int) -> list[PreparedTask]:
    """Read each task file once and tokenize its prompts at every shot count."""
    tok = tokenizer if isinstance(tokenizer, TokenizerView) else TokenizerView(tokenizer)
    prepared = []
    for cfg in tasks:
        groups = (load_categories(cfg.dataset_uri, cfg.icl_task_type) if cfg.has_categories
                  else {None: load_items(cfg.dataset_uri, cfg.icl_task_type)})
        max_len = min(cfg.max_seq_len or max_seq_len, max_seq_len)
        new_tokens = 0
        if cfg.icl_task_type == "question_answering":
            every = [item for items in groups.values() for item in items]
            new_tokens = cfg.max_new_tokens or max_answer_tokens(every, tok, cfg.cot_delimiter)
            if new_tokens >= max_len:
                raise ValueError(f"icl_tasks {cfg.label}: answers of {new_tokens} tokens leave no room for the "
                                 f"prompt in max_seq_len={max_len}; set max_new_tokens lower")
        for shots in cfg.num_fewshot:
            for category, items in groups.items():
                rows = [tokenize_prompt(p, tok, max_len - new_tokens, f"icl_tasks {cfg.label}")
                        for p in build_prompts(items, cfg, shots)]
                prepared.append(PreparedTask(cfg, shots, rows, new_tokens, category))
    return prepared


def _score_batch(task: PreparedTask, batch: list[Prompted], logits: LogitsFn, tok: TokenizerView,
                 device: torch.device | str, lockstep: bool) -> list[bool]:
    """Whether the model gets each item of the batch right."""
    kind = task.cfg.icl_task_type
    if kind == "question_answering":
        outputs = greedy_generate(logits, [p.contexts[0] for p in batch], task.max_new_tokens, tok.pad_id,
                                  tok.eos_id, device, stop_early=not lockstep)
        cfg = task.cfg
        return [answer_is_right(tok.decode(out), p.answers, cfg.early_stopping_criteria, cfg.cot_delimiter,
                                cfg.do_normalization) for p, out in zip(batch, outputs, strict=True)]
    contexts = [c for p in batch for c in p.contexts]
    continuations = [c for p in batch for c in p.continuations]
    scores = score_continuations(logits, contexts, continuations, tok.pad_id, device)
    if kind == "language_modeling":
        return [s.greedy_match for s in scores]
    right, at = [], 0
    for p in batch:  # the option of the highest mean log-likelihood (lowest perplexity); ties: the first
        options = scores[at:at + len(p.contexts)]
        at += len(p.contexts)
        right.append(int(np.argmax([s.mean_logprob for s in options])) == p.gold)
    return right


def score_task(task: PreparedTask, logits: LogitsFn, tok: TokenizerView, device: torch.device | str, *,
               rank: int = 0, world_size: int = 1, max_batches: int | None = None,
               lockstep: bool | None = None) -> tuple[int, int]:
    """(right, scored) over this rank's share of the items (at most `max_batches` batches of them).
    `lockstep` (default: with several ranks) makes every call the same number of forward passes."""
    mine = task.prompts[rank::world_size]
    per = task.items_per_batch
    batches = math.ceil(math.ceil(len(task.prompts) / world_size) / per)
    if max_batches is not None:
        batches = min(batches, max_batches)
    right = scored = 0
    for b in range(batches):
        batch = mine[b * per:(b + 1) * per]
        counted = bool(batch)
        results = _score_batch(task, batch or task.prompts[:1], logits, tok, device,
                               lockstep=world_size > 1 if lockstep is None else lockstep)
        if counted:
            right += sum(results)
            scored += len(results)
    return right, scored


def evaluate_icl(tasks: Sequence[PreparedTask], model: Any, tokenizer: Any, *, device: torch.device | str | None = None,
                 rank: int = 0, world_size: int = 1, subset_num_batches: int | None = None,
                 gauntlet: GauntletConfig | None = None, replicas: int = 1) -> dict[str, float]:
    """`icl/<label>/<n>-shot` accuracies over all ranks, and the `icl/average` (see gauntlet.py).

    `model` is a model (put in eval mode for the call) or a bare `logits(input_ids)` function. `rank`
    and `world_size` count the groups that score different items; `replicas` processes score the same
    ones (a tensor-parallel group: `rank` is then the group's index) and count once."""
    if not tasks:
        return {}
    tok = tokenizer if isinstance(tokenizer, TokenizerView) else TokenizerView(tokenizer)
    module = model if isinstance(model, torch.nn.Module) else None
    if device is None:
        device = next(module.parameters()).device if module is not None else "cpu"
    logits = logits_fn(model) if module is not None else model
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    try:
        counts = [score_task(t, logits, tok, device, rank=rank, world_size=world_size,
                             max_batches=subset_num_batches, lockstep=world_size * replicas > 1) for t in tasks]
    finally:
        if module is not None:
            module.train(was_training)
    totals = all_reduce_(torch.tensor(counts, dtype=torch.float64 if str(device) == "cpu" else torch.float32,
                                      device=device)).div_(replicas).tolist()
    metrics: dict[str, float] = {}
    parts: dict[str, list[tuple[float, float]]] = {}  # a task's categories (or just itself)
    for task, (right, scored) in zip(tasks, totals, strict=True):
        accuracy = right / scored if scored else 0.0
        metrics[f"icl/{task.key}"] = accuracy
        parts.setdefault(task.name, []).append((accuracy, scored))
    scores = {name: (sum(a for a, _ in p) / len(p), sum(n for _, n in p)) for name, p in parts.items()}
    metrics.update({f"icl/{name}": accuracy for name, (accuracy, _) in scores.items()})
    metrics.update(aggregate(scores, gauntlet))
    return metrics
