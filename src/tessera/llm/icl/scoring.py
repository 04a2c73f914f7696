"""What the model is asked for ICL: log-likelihoods of continuations, and greedy answers.

Everything here needs only `logits(input_ids [B, T]) -> [B, T, vocab]`, which Tessera's GPT, the
transformers adapter (llm/hf/adapter.py) and, through `logits_fn`, a bare `AutoModelForCausalLM` all are.
Rows are right-padded: in a causal model a position never sees the padding after it, so no attention
mask is needed and every row reads its own positions.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

LogitsFn = Callable[[torch.Tensor], torch.Tensor]


def logits_fn(model: Any) -> LogitsFn:
    """`ids -> logits` of a model: Tessera's models are such a function; a transformers model returns an
    output object whose `.logits` it is."""
    if hasattr(model, "cfg") or hasattr(model, "hf"):
        return model
    return lambda ids: model(input_ids=ids, use_cache=False).logits


def model_seq_len(model: Any) -> int:
    """The longest sequence the model takes (GPT's config, the adapter's, or a transformers config's)."""
    from tessera.llm.hf.adapter import default_seq_len

    cfg = getattr(model, "cfg", None)
    if cfg is not None and hasattr(cfg, "max_seq_len"):
        return int(cfg.max_seq_len)
    if getattr(model, "max_seq_len", None):
        return int(model.max_seq_len)
    return default_seq_len(model.config)


def _padded(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | str) -> torch.Tensor:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return ids.to(device)


@dataclass(frozen=True)
class ContinuationScore:
    mean_logprob: float  # per continuation token: Foundry ranks choices by this (lowest perplexity)
    greedy_match: bool   # every continuation token is the model's argmax there (LAMBADA-style accuracy)
    sum_logprob: float = float("-inf")  # the continuation's whole log-likelihood (`tessera llm eval --task`)


@torch.no_grad()
def score_continuations(logits: LogitsFn, contexts: Sequence[Sequence[int]],
                        continuations: Sequence[Sequence[int]], pad_id: int,
                        device: torch.device | str) -> list[ContinuationScore]:
    """One forward pass over the rows context + continuation; the continuation's score in each."""
    rows = [list(c) + list(k) for c, k in zip(contexts, continuations, strict=True)]
    out = logits(_padded(rows, pad_id, device))
    scores = []
    for r, (context, continuation) in enumerate(zip(contexts, continuations, strict=True)):
        start, end = len(context), len(context) + len(continuation)
        if start == end:  # nothing to score (an empty answer): never right, never chosen
            scores.append(ContinuationScore(float("-inf"), False))
            continue
        predicted = out[r, start - 1:end - 1].float()  # position t predicts token t + 1
        target = torch.tensor(list(continuation), dtype=torch.long, device=predicted.device)
        logprob = F.log_softmax(predicted, dim=-1).gather(-1, target[:, None]).squeeze(-1)
        scores.append(ContinuationScore(float(logprob.mean()), bool((predicted.argmax(-1) == target).all()),
                                        float(logprob.sum())))
    return scores


@torch.no_grad()
def greedy_generate(logits: LogitsFn, prompts: Sequence[Sequence[int]], max_new_tokens: int, pad_id: int,
                    eos_id: int | None, device: torch.device | str, stop_early: bool = True) -> list[list[int]]:
    """The most likely `max_new_tokens` tokens after each prompt (a row ends at EOS). With
    `stop_early=False` every call makes exactly `max_new_tokens` forward passes, which ranks that shard
    one model (FSDP) need so that none waits for another that stopped sooner."""
    width = max(len(p) for p in prompts) + max_new_tokens
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, :len(prompt)] = torch.tensor(list(prompt), dtype=torch.long)
    ids = ids.to(device)
    ends = [len(p) for p in prompts]  # the next free position of each row
    new: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_new_tokens):
        if stop_early and all(done):
            break
        out = logits(ids[:, :max(ends)])
        for i in range(len(prompts)):
            if done[i]:
                continue
            token = int(out[i, ends[i] - 1].argmax())
            ids[i, ends[i]] = token
            ends[i] += 1
            if token == eos_id:
                done[i] = True
            else:
                new[i].append(token)
    return new


def normalize_answer(text: str) -> str:
    """TriviaQA's normalisation, as Foundry applies it: lower case, underscores and punctuation (and
    curly quotes) to spaces, articles dropped, whitespace collapsed."""
    text = text.replace("_", " ").lower()
    punctuation = set(string.punctuation + "\u2018\u2019\u00b4`")
    text = "".join(" " if ch in punctuation else ch for ch in text)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split()).strip()


def answer_is_right(output: str, answers: Sequence[str], stops: Sequence[str] | None, cot_delimiter: str,
                    normalize: bool) -> bool:
    """Foundry's exact match: the output, cut at the first stop sequence and after the last chain-of-
    thought delimiter, starts with one of the answers (both normalised, or stripped)."""
    if stops:
        output = re.split("|".join(map(re.escape, stops)), output)[0]
    if cot_delimiter:
        output = output.split(cot_delimiter)[-1]
    clean = normalize_answer if normalize else str.strip
    got = clean(output)
    return any(got.startswith(clean(answer)) for answer in answers)
