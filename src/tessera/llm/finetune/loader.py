"""A recipe loader over fine-tuning examples: prepare once (`cache.py`), then stream the cache.

The prepared rows are an ordinary MDS dataset, so they stream through `StreamingDataset` with the
recipe's shuffle options, and a run resumes, elastically too, exactly as it does on pre-training streams.
"""

from __future__ import annotations

import sys
from typing import Any

from tessera.llm.finetune.batch import ExampleBatch
from tessera.llm.finetune.cache import prepared
from tessera.llm.finetune.chat import ChatTemplateError
from tessera.llm.finetune.examples import ExampleError
from tessera.llm.tokenizer import TokenizerError
from tessera.shards.inputs import InputNotFound
from tessera.stream import Stream, StreamingDataLoader, StreamingDataset
from tessera.stream.world import resolve_world


def example_loader(spec: Any, batch_size: int, seq_len: int, tokenizer: Any,
                   section: str = "data.train") -> StreamingDataLoader:
    """The loader of a recipe section with `path` (an `ExampleSource` that is also a `StreamingConfig`)."""
    try:
        folder, summary = prepared(spec.path, tokenizer, seq_len=seq_len, fmt=spec.format, loss_on=spec.loss_on,
                                   truncation=spec.truncation, pack=spec.pack, text_field=spec.text_field,
                                   cache_root=spec.prep_cache)
    except (ExampleError, ChatTemplateError, TokenizerError, InputNotFound) as exc:  # name the recipe key
        raise type(exc)(f"{section}.path: {exc}") from None
    if resolve_world().rank == 0:
        sys.stderr.write(f"{section}: {describe(summary)} ({folder})\n")
    collate = ExampleBatch(packed=spec.pack)
    ds = StreamingDataset(streams=[Stream(local=str(folder), split="train")], batch_size=batch_size,
                          columns=collate.columns, **spec.dataset_options())
    loader = StreamingDataLoader(ds, batch_size=batch_size, batch_path=True, num_workers=spec.num_workers,
                                 collate_fn=collate)
    loader.prep_summary = summary  # type: ignore[attr-defined]  # for the trainer's logs and run config
    return loader


def describe(summary: dict[str, Any]) -> str:
    """One line of a prep summary: what was kept, dropped, and the share of padding."""
    if not summary:
        return "prepared examples"
    rows = sum(summary["rows"].values())
    dropped = summary["dropped_too_long"] + summary["dropped_no_loss"]
    return (f"{summary['examples']:,} examples of {summary['records']:,} records -> {rows:,} "
            f"{'packed' if summary['pack'] else 'padded'} rows of {summary['seq_len']}, "
            f"{summary['padding_share']:.1%} padding, {summary['loss_tokens']:,} loss tokens; "
            f"{summary['truncated']:,} truncated, {dropped:,} dropped ({summary['dropped_too_long']:,} too long, "
            f"{summary['dropped_no_loss']:,} without a reply to learn)")
