"""Language models on Tessera: an MPT-style GPT, tokenizers, data prep, evaluation, generation, export.

- `model`: `GPT`, `GPTConfig` (named: tiny, mpt-125m ... mpt-7b); `model(batch) -> loss`.
- `tokenizer`: `train_bpe`, `ByteTokenizer`, `load_tokenizer(path | "byte")`.
- `prep`: `prep(input, out, tokenizer, seq_len)` -> OUT/train, OUT/val MDS datasets of token windows.
- `eval`: `perplexity`, `mds_batches`, `evaluate_multiple_choice`, `ModelScorer`, `load_mc_task`.
- `generate`: `generate`, `complete` (KV cache; greedy, temperature, top-k, top-p).
- `export`: `save_pretrained`, `load_pretrained`, `load_model` (export or checkpoint).

Submodules are imported on use: data prep workers must not pay for importing torch.
"""
