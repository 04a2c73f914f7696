"""Fine-tuning data: chat, instruction and text examples to packed (or padded) MDS rows with loss masks.

One pass makes the rows (`prep.py`), each step in one place:
- `reader.py`: records read in bounded memory (JSONL, also gzip; Parquet; text files), each bad line
  (not UTF-8, not JSON, too deep, too long) with its place ("FILE, line N");
- `rows.py`: the typed row of each form (pydantic), the one check of a record;
- `examples.py`: a row (`{"messages"}`, `{"prompt", "response"}`, `{"text"}`) to tokens and loss mask;
  which tokens carry loss; truncation of long examples (cut before tokenizing when far too long);
- `chat.py`: the tokenizer side: chat templates (the tokenizer's own, or ChatML by default) and how
  assistant replies are found.
- `packing.py`: rows of the context length; packed rows keep attention inside each example.
- `prep.py`: `prep_examples`, the whole file to MDS (`tessera llm prep --format chat ...`),
  deterministic for any number of workers; bad rows refused (or skipped and counted: `on_bad_row`).
- `config.py`: the options (`ExampleOptions`, checked once) and a recipe's `data.train.path`;
  `cache.py`: that file prepared once into a local cache.
- `batch.py`: the batch the loader yields (`tokens`, `labels`, `position_ids`/`sequence_ids` or
  `attention_mask`) and what a model reads from it.

Names load on first use, so prep's worker processes do not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what type checkers and the reference docs see; at run time __getattr__ loads them
    from tessera.llm.finetune.batch import ExampleBatch, padding_share
    from tessera.llm.finetune.cache import prepared
    from tessera.llm.finetune.chat import DEFAULT_CHAT_TEMPLATE, ExampleTokenizer, load_example_tokenizer
    from tessera.llm.finetune.config import ExampleOptions, ExampleSource
    from tessera.llm.finetune.examples import Encoded, ExampleError, encode_record, fit
    from tessera.llm.finetune.packing import RowBuilder
    from tessera.llm.finetune.prep import ExamplePrepSummary, prep_examples
    from tessera.llm.finetune.rows import parse_row

__getattr__ = lazy_exports(__name__, {
    "batch": ["ExampleBatch", "padding_share"],
    "cache": ["prepared"],
    "chat": ["DEFAULT_CHAT_TEMPLATE", "ExampleTokenizer", "load_example_tokenizer"],
    "config": ["ExampleOptions", "ExampleSource"],
    "examples": ["Encoded", "ExampleError", "encode_record", "fit"],
    "packing": ["RowBuilder"],
    "prep": ["ExamplePrepSummary", "prep_examples"],
    "rows": ["parse_row"],
})

__all__ = ["DEFAULT_CHAT_TEMPLATE", "Encoded", "ExampleBatch", "ExampleError", "ExampleOptions",
           "ExamplePrepSummary", "ExampleSource", "ExampleTokenizer", "RowBuilder", "encode_record", "fit", "load_example_tokenizer",
           "padding_share", "parse_row", "prep_examples", "prepared"]

