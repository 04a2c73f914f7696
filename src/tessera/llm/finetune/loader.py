"""A recipe loader over fine-tuning examples: prepare once (`cache.py`), then stream the cache.

The prepared rows are an ordinary MDS dataset, so they stream through `StreamingDataset` with the
recipe's shuffle options, and a run resumes, elastically too, exactly as it does on pre-training streams.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tessera.llm.finetune.batch import ExampleBatch
from tessera.llm.finetune.cache import prepared
from tessera.llm.finetune.chat import ChatTemplateError
from tessera.llm.finetune.examples import ExampleError
from tessera.llm.finetune.prep import SUMMARY_NAME
from tessera.llm.tokenizer import TokenizerError
from tessera.shards.inputs import InputNotFound
from tessera.storage import StorageError, open_store
from tessera.stream import Stream, StreamingDataLoader, StreamingDataset
from tessera.stream.forksafe import call_outside_runtime
from tessera.stream.world import resolve_world
from tessera.train.callbacks import Callback, TrainerView


def example_loader(spec: Any, batch_size: int, seq_len: int, tokenizer: Any,
                   section: str = "data.train") -> StreamingDataLoader:
    """The loader of a recipe section with `path` (an `ExampleSource` that is also a `StreamingConfig`)."""
    try:
        folder, summary = prepared(spec.path, tokenizer, seq_len=seq_len, cache_root=spec.prep_cache,
                                   **spec.example_options().model_dump())
    except (ExampleError, ChatTemplateError, TokenizerError, InputNotFound) as exc:  # name the recipe key
        raise type(exc)(f"{section}.path: {exc}") from None
    world = resolve_world()
    if world.rank == 0:
        sys.stderr.write(f"{section}: {describe(summary)} ({folder})\n")
    if section == "data.train":  # evaluation may end on a short batch
        _one_batch_at_least(summary, batch_size * world.world_size, spec.path, section)
    collate = ExampleBatch(packed=spec.pack)
    ds = StreamingDataset(streams=[Stream(local=str(folder), split="train")], batch_size=batch_size,
                          columns=collate.columns, **spec.dataset_options())
    loader = StreamingDataLoader(ds, batch_size=batch_size, batch_path=True, num_workers=spec.num_workers,
                                 collate_fn=collate)
    loader.prep_summary = summary  # type: ignore[attr-defined]  # for the trainer's logs and run config
    return loader


def _one_batch_at_least(summary: dict[str, Any], needed: int, path: str, section: str) -> None:
    """ExampleError when the prepared rows do not fill one batch over all ranks: each rank's loader would
    yield a short batch, which the trainer refuses without saying why."""
    rows = summary.get("rows", {}).get("train", needed)
    if rows >= needed:
        return
    kind = "packed" if summary.get("pack", True) else "padded"
    raise ExampleError(f"{section}.path: {path}: {summary.get('examples', 0):,} examples make {rows:,} {kind} "
                       f"rows of {summary.get('seq_len')} tokens, fewer than one batch of {needed:,} rows "
                       "(global_train_batch_size); add examples or lower the batch size")


def streamed_summary(spec: Any, section: str = "data.train") -> dict[str, Any]:
    """The prep summary of a section's one stream of fine-tuning rows (`finetune-prep.json`, which prep
    writes at the root of its output, beside `train/`), printed like `path`'s; {} when there is none or
    the section mixes several streams."""
    if len(spec.streams) != 1:
        return {}
    root = spec.streams[0].remote or spec.streams[0].local
    if not root:
        return {}
    try:  # from a fork()ed helper, as the stream reads its index: DataLoader workers fork after this
        raw = call_outside_runtime(lambda: open_store(root).get(SUMMARY_NAME))
        summary = json.loads(raw)
    except (StorageError, ValueError):
        return {}
    if resolve_world().rank == 0:
        sys.stderr.write(f"{section}: {describe(summary)} ({root})\n")
    return summary


def prep_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """What the loggers get of a prep summary: the share of padding, the examples kept, truncated, dropped."""
    return {"data/padding_share": float(summary["padding_share"]), "data/examples": summary["examples"],
            "data/examples_truncated": summary["truncated"],
            "data/examples_dropped": summary["dropped_too_long"] + summary["dropped_no_loss"]}


class PrepSummaryLog(Callback):
    """Logs the training data's prep summary (`prep_metrics`) to every logger once, when the run starts."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.metrics = prep_metrics(summary)

    def on_fit_start(self, trainer: TrainerView) -> None:
        if trainer.rank == 0:
            for logger in getattr(trainer, "loggers", ()):
                logger.log_metrics(self.metrics, trainer.timestamp.batch)


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
            f"{summary['dropped_no_loss']:,} without a reply to learn)" + _skipped(summary))


def _skipped(summary: dict[str, Any]) -> str:
    bad = summary.get("bad_rows", 0)
    return f"; {bad:,} bad rows skipped (the first: {summary['first_bad_row']})" if bad else ""
