"""Text generation: greedy or sampled (temperature, top-k, top-p), with a KV cache.

    model, tok = load_model("out/gpt-tiny")                     # export or checkpoint
    print(complete(model, tok, "def main(", max_new_tokens=64, top_k=50, seed=0))

With the cache, the prompt is run once and each new token costs one position; without it every step
re-runs the whole sequence (nanoGPT's loop). Both give the same tokens within the model's window
(`max_seq_len`); the window handling differs beyond it. When the sequence outgrows the
model's window, the oldest tokens are dropped: without the cache at every step, with the cache by
re-running the newest half window and continuing from there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tessera.llm.model import GPT, KVCache
from tessera.llm.tokenizer import Tokenizer


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Logits [B, V] with everything outside the top k and outside the nucleus p set to -inf."""
    if top_k is not None and 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the smallest set reaching p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def next_token(logits: torch.Tensor, greedy: bool, temperature: float, top_k: int | None, top_p: float | None,
               generator: torch.Generator | None) -> torch.Tensor:
    if greedy or temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)


@torch.no_grad()
def generate(model: GPT, prompt: Sequence[int] | torch.Tensor, max_new_tokens: int, *, greedy: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             eos_id: int | None = None, use_cache: bool = True, seed: int | None = None,
             on_token: Callable[[int], None] | None = None) -> list[int]:
    """The new token ids after `prompt` (one sequence); stops early at `eos_id` (included)."""
    if len(prompt) == 0:
        raise ValueError("the prompt is empty; give at least one token (e.g. the EOS token)")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    window = model.cfg.max_seq_len
    seq = torch.as_tensor(list(prompt), dtype=torch.long, device=device)[None, -window:]
    cache: KVCache | None = None
    new: list[int] = []
    try:
        for _ in range(max_new_tokens):
            if not use_cache:
                logits = model(seq[:, -window:])[:, -1]
            elif cache is None or cache.pos >= window:
                keep = seq[:, -(window // 2 or 1):] if cache is not None else seq
                cache = model.new_kv_cache(1)
                logits = model(keep, kv_cache=cache)[:, -1]
            else:
                logits = model(seq[:, -1:], kv_cache=cache)[:, -1]
            token = next_token(logits.float(), greedy, temperature, top_k, top_p, generator)
            seq = torch.cat([seq, token], dim=1)
            new.append(int(token))
            if on_token is not None:
                on_token(new[-1])
            if eos_id is not None and new[-1] == eos_id:
                break
    finally:
        model.train(was_training)
    return new


def complete(model: GPT, tokenizer: Tokenizer, prompt: str, max_new_tokens: int = 128, **options) -> str:  # noqa: ANN003
    """The text generated after `prompt` (stops at the end-of-text token, which is not returned)."""
    ids = tokenizer.encode(prompt) or [tokenizer.eos_id]
    out = generate(model, ids, max_new_tokens, eos_id=tokenizer.eos_id, **options)
    if out and out[-1] == tokenizer.eos_id:
        out = out[:-1]
    return tokenizer.decode(out)
