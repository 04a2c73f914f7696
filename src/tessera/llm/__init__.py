"""Language models on Tessera: an MPT-style GPT, tokenizers, data prep, recipes, evaluation, export.

- `GPT`, `GPTConfig` (named: tiny, mpt-125m ... mpt-7b); `model(batch) -> loss`.
- `train_bpe`, `ByteTokenizer`, `BPETokenizer`, `load_tokenizer(path | "byte")`.
- `tessera.llm.prep.prep(input, out, tokenizer, seq_len)` -> OUT/train, OUT/val MDS datasets of token
  windows (`tessera llm prep`).
- `load_recipe(path, overrides)` -> `Recipe`; `train(recipe)` runs it (`tessera train`).
- `perplexity`, `mds_batches`, `evaluate_multiple_choice`, `ModelScorer`, `load_mc_task`.
- `complete` and `tessera.llm.generate.generate` (KV cache; greedy, temperature, top-k, top-p).
- `save_pretrained`, `load_pretrained`, `load_model` (an export or a checkpoint).

`prep` and `generate` stay in their modules: a function here with a module's name would hide the module.
Names load on first use, so data prep workers do not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what type checkers and the reference docs see; at run time __getattr__ loads them
    from tessera.llm.eval import ModelScorer, evaluate_multiple_choice, load_mc_task, mds_batches, perplexity
    from tessera.llm.export import ExportError, load_model, load_pretrained, save_pretrained
    from tessera.llm.generate import complete
    from tessera.llm.model import GPT, GPTConfig
    from tessera.llm.recipe import Recipe, RecipeError, load_recipe, shipped_recipes
    from tessera.llm.tokenizer import (
        BPETokenizer,
        ByteTokenizer,
        Tokenizer,
        TokenizerError,
        load_tokenizer,
        train_bpe,
    )
    from tessera.llm.train_run import train

__getattr__ = lazy_exports(__name__, {
    "eval": ["ModelScorer", "evaluate_multiple_choice", "load_mc_task", "mds_batches", "perplexity"],
    "export": ["ExportError", "load_model", "load_pretrained", "save_pretrained"],
    "generate": ["complete"],
    "model": ["GPT", "GPTConfig"],
    "recipe": ["Recipe", "RecipeError", "load_recipe", "shipped_recipes"],
    "tokenizer": ["BPETokenizer", "ByteTokenizer", "Tokenizer", "TokenizerError", "load_tokenizer", "train_bpe"],
    "train_run": ["train"],
})

__all__ = [
    "BPETokenizer", "ByteTokenizer", "ExportError", "GPT", "GPTConfig", "ModelScorer", "Recipe", "RecipeError",
    "Tokenizer", "TokenizerError", "complete", "evaluate_multiple_choice", "load_mc_task", "load_model",
    "load_pretrained", "load_recipe", "load_tokenizer", "mds_batches", "perplexity", "save_pretrained",
    "shipped_recipes", "train", "train_bpe",
]

