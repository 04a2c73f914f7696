"""Tiny random Hugging Face models and a local chat tokenizer for the fine-tuning tests (no hub access)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from llm_helpers import WORDS

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>\n{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
SPECIALS = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]


def chat_examples(n: int, seed: int = 0) -> list[dict]:
    """Chat examples with a learnable rule: the assistant repeats the user's words in reverse order."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))]
        out.append({"messages": [{"role": "user", "content": "reverse: " + " ".join(words)},
                                 {"role": "assistant", "content": " ".join(reversed(words))}]})
    return out


def write_chat_jsonl(path: Path, n: int, seed: int = 0) -> list[dict]:
    examples = chat_examples(n, seed)
    path.write_text("".join(json.dumps(e) + "\n" for e in examples))
    return examples


def chat_tokenizer(vocab_size: int = 320):
    """A byte-level BPE trained on the test words, wrapped as a transformers tokenizer with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = [" ".join(e["messages"][0]["content"].split() + e["messages"][1]["content"].split())
            for e in chat_examples(300, seed=99)]
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   additional_special_tokens=SPECIALS[3:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(folder: Path, seed: int = 0, vocab_size: int | None = None, tokenizer=None) -> Path:
    """Save a 2-layer random Llama (d_model 32) and its chat tokenizer to `folder`; returns the folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or chat_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size or len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    # A random output layer at transformers' init (std 0.02) spans logits of about +-0.5 whatever the hidden
    # state: a frozen one would cap what LoRA can learn, so it is drawn wider, as a trained one is.
    torch.nn.init.normal_(model.lm_head.weight, std=0.3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
