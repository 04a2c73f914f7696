"""Turn a validated recipe into a model, data loaders, optimizer, schedule and Trainer, and run it.

This is what `tessera train RECIPE.yaml key=value ...` calls. SIGTERM (the platform's "checkpoint and
stop") and SIGINT (Ctrl-C) ask the trainer to stop after the current batch; it saves, and the process exits
with 143 or 130 so a supervisor can tell a requested stop from a finished run (`tessera.train.stop`).
"""

from __future__ import annotations

import gc
import os
from typing import Any

import torch

from tessera.llm.finetune.batch import ExampleBatch
from tessera.llm.finetune.loader import PrepSummaryLog, example_loader, streamed_summary
from tessera.llm.hf.cache import local_model_folder
from tessera.llm.hf.composer_start import composer_trainer_config
from tessera.llm.hf.config import PretrainedSpec, is_pretrained
from tessera.llm.hf.fingerprint import FINGERPRINT_KEY, BaseCheck, base_fingerprint
from tessera.llm.hf.load import (
    load_hf_tokenizer,
    load_pretrained_model,
    pretrained_seq_len,
    pretrained_tokenizer,
    quantization_config,
)
from tessera.llm.hf.lora import add_lora
from tessera.llm.icl.callback import icl_evaluator
from tessera.llm.model import GPT
from tessera.llm.model_source import is_remote
from tessera.llm.recipe import LoaderSpec, Recipe, RecipeError
from tessera.llm.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from tessera.llm.tokens import stream_collate
from tessera.shards import ShardError
from tessera.shards.sources import SourceError
from tessera.storage import StorageError
from tessera.stream import Stream, StreamingDataLoader, StreamingDataset
from tessera.train import Trainer
from tessera.train.distributed import current_env, destroy
from tessera.train.stop import stop_on_signals
from tessera.train.trainer import seed_all


class DataUnavailable(RuntimeError):
    """A dataset the recipe names cannot be opened (no index.json, no bucket, no access); names the key."""

    @classmethod
    def of(cls, section: str, exc: Exception) -> DataUnavailable:
        if isinstance(exc, SourceError):  # the examples of `path` cannot be read
            return cls(f"{section}.path: {exc}")
        hint = (f"; point {section}.streams.0.remote at a dataset (`tessera llm prep` makes one)"
                if isinstance(exc, FileNotFoundError) else "")
        return cls(f"{section}.streams: {exc}{hint}")


def build_loader(spec: LoaderSpec, batch_size: int, seq_len: int, tokenizer: Any = None,
                 section: str = "data.train", replication: int = 1) -> StreamingDataLoader:
    """`replication`: consecutive ranks that read the same samples (a tensor-parallel group)."""
    if spec.path:  # fine-tuning examples: prepared once into a local cache, then streamed like streams
        if replication > 1:
            raise RecipeError(f"{section}.path: fine-tuning examples are not yet read the same by the ranks of a "
                              "tensor-parallel group; use parallelism.tensor_parallel.degree=1")
        return example_loader(spec, batch_size, seq_len, tokenizer, section)
    # Tessera's fixed windows stack as they are; LLM Foundry's ndarray:int32 / bytes tokens need a collate;
    # fine-tuning rows prepared into a bucket yield the batch `path` gives (labels, positions or mask), so
    # the columns read follow the collate the streams' indexes call for.
    collates: list[Any] = []

    def columns(streams: list[Any]) -> list[str]:
        collates.append(stream_collate(streams, seq_len, spec.token_encoding_type, section, tokenizer))
        return getattr(collates[0], "columns", ["tokens"])  # fine-tuning rows and text name theirs

    ds = StreamingDataset(streams=[Stream(**s.model_dump()) for s in spec.streams], batch_size=batch_size,
                          columns=columns, replication=replication, **spec.dataset_options())
    collate = collates[0]
    loader = StreamingDataLoader(ds, batch_size=batch_size, batch_path=True, num_workers=spec.num_workers,
                                 collate_fn=collate)
    if isinstance(collate, ExampleBatch):
        loader.prep_summary = streamed_summary(spec, section)  # type: ignore[attr-defined]
    return loader


def build_model(recipe: Recipe, vocab_size: int) -> torch.nn.Module:
    """The recipe's model: a pretrained one (`model.pretrained`: a Hugging Face folder or a Tessera GPT) or
    a GPT shape, with LoRA adapters when the recipe has a `lora` section (then only they train)."""
    if is_pretrained(recipe.model):
        return load_pretrained_model(PretrainedSpec.model_validate(recipe.model), recipe.lora)[0]
    fields = dict(recipe.model)
    fields.setdefault("vocab_size", vocab_size)  # the tokenizer decides unless the recipe pins it
    if fields["vocab_size"] < vocab_size:
        raise RecipeError(f"model.vocab_size={fields['vocab_size']} is smaller than the tokenizer's {vocab_size}")
    model = GPT(type(recipe.gpt_config()).from_dict(fields))
    return add_lora(model, recipe.lora) if recipe.lora is not None else model


def model_seq_len(recipe: Recipe) -> int:
    """The longest training sequence of the recipe's model (read from config.json for a pretrained one)."""
    if is_pretrained(recipe.model):
        return pretrained_seq_len(PretrainedSpec.model_validate(recipe.model))
    return recipe.gpt_config().max_seq_len


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What the optimizer steps: every parameter, or only the LoRA adapters when the base is frozen."""
    return [p for p in model.parameters() if p.requires_grad]


def recipe_tokenizer(recipe: Recipe) -> Tokenizer | Any:
    """The recipe's tokenizer; a file that is not one fails naming the key and the file. A pretrained
    model brings its own (a transformers tokenizer, with the chat template the data side applies) unless
    the recipe names a tokenizer folder (local or in a bucket, as LLM Foundry's tokenizer.name does): a
    pretrained model then reads it with transformers, a GPT its tokenizer.json."""
    name = str(local_model_folder(recipe.tokenizer)) if is_remote(recipe.tokenizer) else recipe.tokenizer
    folder = os.path.isdir(name)
    if is_pretrained(recipe.model) and folder:
        return load_hf_tokenizer(name)
    if is_pretrained(recipe.model):
        own = pretrained_tokenizer(PretrainedSpec.model_validate(recipe.model))
        if own is not None:
            return own
    try:
        return load_tokenizer(os.path.join(name, "tokenizer.json") if folder else name)
    except TokenizerError:
        raise
    except Exception as exc:  # the tokenizers library raises plain Exception for a file it cannot read
        raise TokenizerError(f"tokenizer {recipe.tokenizer!r} is not a tokenizer file ({exc})") from None


def make_trainer(recipe: Recipe) -> Trainer:
    """Everything a run needs, checked in order of cheapness (config, tokenizer, data index, then the
    model), so a missing path fails before gigabytes of weights are allocated."""
    if recipe.torch_threads:  # for data prep and model building too; the Trainer owns the choice (cpu_threads.py)
        torch.set_num_threads(recipe.torch_threads)
    tp = recipe.parallelism.tp_degree  # the ranks of a tensor-parallel group read the same batches
    per_device = recipe.check_batches(current_env().world_size // tp)
    quantization_config(recipe.lora)  # QLoRA on a machine without a GPU: one line, before any download
    tokenizer = recipe_tokenizer(recipe)
    seq_len = model_seq_len(recipe)
    try:
        train = build_loader(recipe.data.train, per_device, seq_len, tokenizer, replication=tp)
    except (ShardError, StorageError, SourceError) as exc:
        raise DataUnavailable.of("data.train", exc) from exc
    evals = None
    if recipe.data.eval is not None:
        mb = recipe.device_train_microbatch_size
        try:
            evals = build_loader(recipe.data.eval, recipe.data.eval.batch_size or
                                 (mb if isinstance(mb, int) else per_device), seq_len, tokenizer, "data.eval", tp)
        except (ShardError, StorageError, SourceError) as exc:
            raise DataUnavailable.of("data.eval", exc) from exc
    icl = icl_evaluator(recipe, tokenizer, seq_len, recipe.eval_interval, recipe.max_duration)  # reads task files
    seed_all(recipe.seed)  # the initial weights come from the recipe's seed, not from torch's random start
    model = build_model(recipe, tokenizer.vocab_size)
    optimizer = recipe.optimizer.build(trainable_parameters(model))
    schedule = recipe.scheduler.build()
    callbacks = [icl] if icl is not None else []
    prep_summary = getattr(train, "prep_summary", None)  # fine-tuning data: its padding share and losses
    if prep_summary:
        callbacks.append(PrepSummaryLog(prep_summary))
    base = None
    if is_pretrained(recipe.model):  # resume refuses a base that changed since the checkpoint (hf/fingerprint.py)
        spec = PretrainedSpec.model_validate(recipe.model)
        base = base_fingerprint(spec)
        callbacks.append(BaseCheck(spec, base))
    return Trainer(model, optimizer, train_dataloader=train, schedulers=schedule, eval_dataloader=evals,
                   callbacks=callbacks, run_config=run_config(recipe, model, base, prep_summary),
                   config=composer_trainer_config(recipe.trainer_config(), model))  # a Composer load_path: hf/composer_start.py


def run_config(recipe: Recipe, model: torch.nn.Module, base: dict[str, Any] | None = None,
               prep_summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """What checkpoints remember: the model to rebuild (export, generate) and the whole recipe. A
    pretrained model is remembered by its folder (model.pretrained), which export reads again for the
    frozen weights a LoRA checkpoint leaves out, and by `base`, the fingerprint of that folder's files
    (hf/fingerprint.py), which resume and export compare with the folder they find. Fine-tuning data
    adds its prep summary (`data_prep`: examples, truncated, dropped, padding share)."""
    lora = recipe.lora.model_dump() if recipe.lora is not None else None
    if isinstance(model, GPT):  # a pretrained GPT keeps both: its shape (for load_model) and where it came from
        section = {**(recipe.model if is_pretrained(recipe.model) else {}), **model.cfg.to_dict()}
        config = {"model": section, "lora": lora, "tokenizer": recipe.tokenizer, "recipe": recipe.dump()}
    else:
        config = {"model": dict(recipe.model), "lora": lora, "tokenizer": recipe.model["pretrained"],
                  "recipe": recipe.dump()}
    if prep_summary:  # where prep wrote, its time and processes say nothing of the data
        config["data_prep"] = {k: v for k, v in prep_summary.items() if k not in ("out", "seconds", "workers")}
    return {**config, FINGERPRINT_KEY: base} if base is not None else config


def train(recipe: Recipe) -> int:
    """Run the recipe to its max_duration; returns the process exit code (0, or 143 / 130 when SIGTERM /
    SIGINT stopped it after a checkpoint).

    Leaving is one sequence on every path (finished, stopped, failed): the trainer joins its threads and
    destroys its own process groups (`Trainer.close`), then the default group goes. Left to destructors
    at interpreter exit, a gloo group can abort a rank that finished ("terminate called without an
    active exception"), and torchrun and Slurm then fail the whole job.
    """
    try:
        trainer = make_trainer(recipe)
        with stop_on_signals(trainer) as stop:
            try:
                trainer.fit()
            finally:
                trainer.close()
        code = stop.exit_code(trainer)
        del trainer  # DDP's reducer and FSDP's mesh hold groups: free them before the default group goes
        return code
    finally:
        gc.collect()
        destroy()
