"""`tessera llm tokenizer train|prep|generate|eval|export|info`: language-model data, models and checks.

torch is imported inside the commands that need it, so `tessera --help` stays fast.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from tessera.cli.console import err, fail, out
from tessera.progress import WorkProgress
from tessera.shards import ShardError
from tessera.shards.errors import DatasetExists
from tessera.shards.sources import SourceError
from tessera.storage import StorageError

app = typer.Typer(help="Language models: tokenizers, data prep, generation, evaluation, export.",
                  no_args_is_help=True)
tokenizer_app = typer.Typer(help="Train byte-level BPE tokenizers.", no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")
ERRORS = (ShardError, StorageError, SourceError, ValueError, FileNotFoundError)


@tokenizer_app.command("train")
def tokenizer_train(inputs: list[str] = typer.Argument(..., metavar="INPUT...", help="Files or folders."),
                    vocab_size: int = typer.Option(8192, help="Tokens in total (bytes + merges + specials)."),
                    out_path: str = typer.Option(..., "--out", help="Where to write the tokenizer JSON."),
                    text_field: str = typer.Option("text", help="Field holding the text (JSONL, Parquet)."),
                    fmt: str = typer.Option(None, "--format", help="text, lines, jsonl, parquet (guessed)."),
                    suffix: list[str] = typer.Option(None, help="Only text files with this suffix (.py); "
                                                                "repeatable."),
                    min_frequency: int = typer.Option(2, help="Merge only pairs seen this often."),
                    max_bytes: str = typer.Option(None, help="Read at most this much text, e.g. 50mb.")) -> None:
    """Train a byte-level BPE on text files, JSONL or Parquet; saved as one JSON file."""
    import time

    from tessera.llm.tokenizer import train_bpe
    from tessera.shards.sizes import parse_size

    try:
        t0 = time.perf_counter()
        with err.status(f"training a {vocab_size:,}-token BPE on {', '.join(inputs)}"):
            tok = train_bpe(inputs, vocab_size, text_field=text_field, fmt=fmt, suffixes=suffix or None,
                            min_frequency=min_frequency,
                            max_bytes=parse_size(max_bytes) if max_bytes else None)
        tok.save(out_path)
    except ERRORS as exc:
        fail(exc)
    err.print(f"wrote {out_path}: {tok.vocab_size:,} tokens, EOS id {tok.eos_id} "
              f"({time.perf_counter() - t0:.1f}s)")


@app.command()
def prep(input: str = typer.Argument(..., help="Text files folder, JSONL or Parquet file/folder."),
         out_url: str = typer.Argument(..., metavar="OUT", help="Output folder or bucket URL (gets train/, val/)."),
         tokenizer: str = typer.Option(..., help="Tokenizer JSON, or 'byte'."),
         seq_len: int = typer.Option(2048, help="Tokens per sample window."),
         text_field: str = typer.Option("text", help="Field holding the text (JSONL, Parquet)."),
         fmt: str = typer.Option(None, "--format", help="A corpus cut into windows: text (a document per file), "
                                                         "lines, jsonl, parquet. Fine-tuning examples, one per "
                                                         "row or packed: chat, instruction, auto (by the keys), "
                                                         "or text with --pack/--no-pack."),
         pack: bool = typer.Option(None, "--pack/--no-pack", help="Examples: several per row with attention kept "
                                                                  "inside each (default), or one per row, padded."),
         loss_on: str = typer.Option("all_assistant", help="Examples: loss on all_assistant replies (the "
                                                           "response), last_assistant, or all tokens."),
         truncation: str = typer.Option("prompt_first", help="Examples longer than --seq-len: prompt_first "
                                                             "(cut the prompt side first) or drop."),
         on_bad_row: str = typer.Option("error", help="Examples: a row that is not a valid record stops prep, "
                                                      "naming its file and line (error), or is left out and "
                                                      "counted (skip)."),
         max_record_bytes: str = typer.Option("128mb", help="Examples: a longer record (JSONL line) is a bad "
                                                            "row, never read whole."),
         suffix: list[str] = typer.Option(None, help="Only text files with this suffix (.py); repeatable."),
         val_fraction: float = typer.Option(0.01, help="Fraction of documents held out for validation."),
         workers: int = typer.Option(1, help="Tokenizing processes (the output does not depend on it)."),
         compression: str = typer.Option(None, help="Shard compression, e.g. zstd."),
         size_limit: str = typer.Option("64mb", help="Shard size limit."),
         overwrite: bool = typer.Option(False, help="Replace existing datasets at OUT."),
         engine: str = typer.Option("local", help="Corpora: local processes, or ray (Ray tasks tokenize)."),
         address: str = typer.Option(None, help="--engine ray: the cluster (default: start a local Ray)."),
         as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Tokenize a corpus, append EOS after each document, cut fixed windows, write train/val MDS; or
    (--format chat|instruction|auto, --pack/--no-pack) encode fine-tuning examples with loss masks."""
    from tessera.llm.prep import prep as run_prep

    # a transformers tokenizer folder only encodes examples (a corpus needs a tokenizer JSON or 'byte')
    if fmt in EXAMPLE_FORMATS or pack is not None or (fmt is None and Path(tokenizer).is_dir()):
        _prep_examples(input, out_url, tokenizer, seq_len=seq_len, fmt=fmt, pack=pack is not False,
                       loss_on=loss_on, truncation=truncation, text_field=text_field, on_bad_row=on_bad_row,
                       max_record_bytes=max_record_bytes, val_fraction=val_fraction, workers=workers,
                       compression=compression, size_limit=size_limit, overwrite=overwrite, as_json=as_json)
        return

    try:
        with WorkProgress("tokenizing chunks", err, enabled=not as_json) as bar:
            summary = run_prep(input, out_url, tokenizer, seq_len=seq_len, text_field=text_field, fmt=fmt,
                               suffixes=suffix or None,
                               val_fraction=val_fraction, workers=workers, compression=compression,
                               size_limit=size_limit, mode="overwrite" if overwrite else "create",
                               progress=lambda summary, done, total: bar.update(done, total), engine=engine,
                               address=address)
    except DatasetExists as exc:
        fail(exc.for_overwrite_only())
    except ERRORS as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps({**summary.__dict__, "tokens_per_second": summary.tokens_per_second}))
        return
    err.print(f"{summary.documents:,} documents, {summary.tokens:,} tokens in {summary.seconds:.1f}s "
              f"({summary.tokens_per_second:,.0f} tok/s, {workers} worker(s))"
              + (f"; skipped {summary.skipped_files:,} files that are not UTF-8" if summary.skipped_files else ""))
    for split in ("train", "val"):
        err.print(f"  {split}: {summary.windows[split]:,} windows of {seq_len} ({summary.dtype}) from "
                  f"{summary.documents_per_split[split]:,} documents -> {out_url.rstrip('/')}/{split}")
    if summary.windows["val"] == 0 and val_fraction > 0:
        err.print("[yellow]warning:[/yellow] the val split is empty; raise --val-fraction or add documents")


EXAMPLE_FORMATS = ("chat", "instruction", "auto")


def _prep_examples(input: str, out_url: str, tokenizer: str, *, fmt: str | None, pack: bool, as_json: bool,
                   overwrite: bool, seq_len: int, val_fraction: float, workers: int, compression: str | None,
                   size_limit: str, **options: Any) -> None:
    """`prep` of fine-tuning examples (tessera.llm.finetune.prep)."""
    from tessera.llm.finetune.loader import describe
    from tessera.llm.finetune.prep import example_options, prep_examples

    if fmt == "lines":
        fail(ValueError("--format lines is a corpus format; fine-tuning examples are chat, instruction, text "
                        "or auto records (JSONL, Parquet)"), code=2)
    kind = fmt if fmt in (*EXAMPLE_FORMATS, "text") else "auto"
    try:
        opts = example_options(format=kind, pack=pack, **options)
    except ValueError as exc:
        fail(exc, code=2)
    try:
        with err.status(f"encoding {kind} examples from {input}") if not as_json else contextlib.nullcontext():
            summary = prep_examples(input, out_url, tokenizer, seq_len=seq_len, val_fraction=val_fraction,
                                    workers=workers, compression=compression, size_limit=size_limit,
                                    mode="overwrite" if overwrite else "create", fmt=opts.format,
                                    **opts.model_dump(exclude={"format"}))
    except DatasetExists as exc:
        fail(exc.for_overwrite_only())
    except ERRORS as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(summary.to_dict()))
        return
    splits = [f"{out_url.rstrip('/')}/{s} ({n:,} rows)" for s, n in summary.rows.items() if n or s == "train"]
    err.print(f"{describe(summary.to_dict())} in {summary.seconds:.1f}s -> {', '.join(splits)}")


def _load(path: str, tokenizer: str | None, *, generation: bool = False) -> tuple[Any, Any]:
    """The model at `path` (a transformers folder, a Tessera export or checkpoint: load_checkpoint_model,
    through resolve_model_source, tells them apart) and its tokenizer, or `tokenizer` if given."""
    from tessera.llm.hf.export import load_checkpoint_model
    from tessera.llm.tokenizer import load_tokenizer

    model, tok = load_checkpoint_model(path)
    if generation and not hasattr(model, "cfg"):
        raise ValueError(f"{path}: a Hugging Face model; generation here needs a Tessera GPT (use transformers' "
                         "generate, after tessera llm export --format hf for a checkpoint)")
    if tokenizer:
        tok = load_tokenizer(tokenizer)
    if tok is None:
        raise ValueError(f"{path}: no tokenizer saved with the model; pass --tokenizer")
    if hasattr(model, "cfg") and tok.vocab_size > model.cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} tokens but the model only {model.cfg.vocab_size}")
    return model.eval(), tok


@app.command()
def generate(path: str = typer.Argument(..., metavar="CHECKPOINT_OR_EXPORT"),
             prompt: str = typer.Option(..., help="Text to continue."),
             max_new_tokens: int = typer.Option(128),
             temperature: float = typer.Option(0.8),
             top_k: int = typer.Option(None, help="Sample among the k most likely tokens."),
             top_p: float = typer.Option(None, help="Sample within the smallest set of probability p."),
             greedy: bool = typer.Option(False, help="Always take the most likely token."),
             seed: int = typer.Option(None, help="Seed the sampler (same seed, same text)."),
             tokenizer: str = typer.Option(None, help="Tokenizer JSON or 'byte' (default: the model's)."),
             no_cache: bool = typer.Option(False, help="Recompute every step (slow; for checking the cache)."),
             as_json: bool = typer.Option(False, "--json", help="Print a JSON object instead of streaming.")) -> None:
    """Continue a prompt with a trained model (KV cache; greedy, temperature, top-k, top-p)."""
    import time

    from tessera.llm.generate import generate as run_generate

    try:
        model, tok = _load(path, tokenizer, generation=True)
        ids = tok.encode(prompt) or [tok.eos_id]
        new: list[int] = []
        shown = [0]

        def stream(token: int) -> None:
            new.append(token)
            text = tok.decode(new)
            if not as_json and not text.endswith("\ufffd"):  # wait for the rest of a split character
                sys.stdout.write(text[shown[0]:])
                sys.stdout.flush()
                shown[0] = len(text)

        if not as_json:
            sys.stdout.write(prompt)
        t0 = time.perf_counter()
        run_generate(model, ids, max_new_tokens, greedy=greedy, temperature=temperature, top_k=top_k,
                     top_p=top_p, eos_id=tok.eos_id, use_cache=not no_cache, seed=seed, on_token=stream)
        seconds = time.perf_counter() - t0
    except ERRORS as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps({"prompt": prompt, "completion": tok.decode(new), "tokens": new,
                               "seconds": seconds}))
        return
    sys.stdout.write("\n")
    err.print(f"[dim]{len(new)} tokens in {seconds:.2f}s ({len(new) / max(seconds, 1e-9):,.1f} tok/s)[/dim]")


@app.command("eval")
def evaluate(path: str = typer.Argument(..., metavar="CHECKPOINT_OR_EXPORT"),
             data: str = typer.Option(None, help="Prepared data folder or URL: perplexity on --split."),
             split: str = typer.Option("val"),
             batch_size: int = typer.Option(8),
             max_batches: int = typer.Option(None, help="Evaluate at most this many batches."),
             task: list[str] = typer.Option(None, help="Multiple-choice JSONL task file or shipped name "
                                                       "(tiny_mc); repeatable."),
             icl_tasks: str = typer.Option(None, "--icl-tasks", help="A YAML file with LLM Foundry's icl_tasks "
                                           "(and optionally icl_subset_num_batches, eval_gauntlet), e.g. a "
                                           "recipe: every task type, scored on every rank under `tessera launch`."),
             hf: bool = typer.Option(False, "--hf", hidden=True, help="Accepted for old scripts: a transformers "
                                     "folder is recognised by its config.json."),
             num_fewshot: int = typer.Option(0),
             reduction: str = typer.Option("mean", help="Score choices by mean or sum log-likelihood."),
             tokenizer: str = typer.Option(None, help="Tokenizer JSON or 'byte' (default: the model's)."),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Perplexity on a held-out split, multiple-choice accuracy on --task files, and/or ICL tasks in LLM
    Foundry's formats (--icl-tasks: language modelling, multiple choice, schema, question answering)."""
    from tessera.llm.eval import ModelScorer, evaluate_multiple_choice, load_mc_task, mds_batches, perplexity

    if not data and not task and not icl_tasks:
        fail(ValueError("nothing to evaluate: pass --data, --task and/or --icl-tasks"))
    results: dict[str, Any] = {}
    try:
        section = _icl_section(icl_tasks) if icl_tasks else None
        model, tok = _load(path, tokenizer) if task or icl_tasks else (_load_model_only(path), None)
        if data:
            ppl = perplexity(model, mds_batches(data, split, batch_size, max_batches))
            results["perplexity"] = ppl.__dict__
        for name in task or []:
            res = evaluate_multiple_choice(load_mc_task(name), ModelScorer(model, tok, reduction), num_fewshot)
            results[f"mc/{name}"] = {"accuracy": res.accuracy, "items": res.items}
        if section is not None:
            results["icl"] = _run_icl(section, model, tok)
    except ERRORS as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(results))
        return
    if "perplexity" in results:
        p = results["perplexity"]
        out.print(f"{data} [{split}]: loss {p['loss']:.4f}, perplexity {p['perplexity']:.2f} "
                  f"over {p['tokens']:,} tokens")
    for key, value in results.items():
        if key.startswith("mc/"):
            out.print(f"{key[3:]}: accuracy {value['accuracy']:.3f} on {value['items']} items "
                      f"({num_fewshot}-shot, {reduction})")
    for key, value in results.get("icl", {}).items():
        out.print(f"{key}: {value:.3f}")


def _icl_section(file: str) -> Any:
    """The ICL keys of a YAML file (a tasks file or a whole recipe: other keys are ignored)."""
    import yaml
    from pydantic import ValidationError

    from tessera.llm.icl.config import ICLSection
    from tessera.syntax_errors import yaml_error
    from tessera.typed_config import error_lines

    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
        tree = yaml.safe_load(text)
    except OSError as exc:
        raise FileNotFoundError(f"--icl-tasks {file}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(yaml_error(exc, text, f"--icl-tasks {file}")) from None
    if not isinstance(tree, dict) or "icl_tasks" not in tree:
        raise ValueError(f"--icl-tasks {file}: expected a mapping with an icl_tasks list")
    keys = {k: tree[k] for k in ICLSection.model_fields if k in tree}
    try:
        return ICLSection.model_validate(keys)
    except ValidationError as exc:
        raise ValueError(f"--icl-tasks {file}: {'; '.join(error_lines(exc, lambda loc: ''))}") from None


def _run_icl(section: Any, model: Any, tok: Any) -> dict[str, float]:
    """Score the tasks on this process's share of the items (all of them unless launched on several
    ranks); every rank gets the summed numbers."""
    from tessera.llm.icl import evaluate_icl, prepare_tasks
    from tessera.llm.icl.scoring import model_seq_len
    from tessera.train.distributed import init_distributed

    env = init_distributed(next(model.parameters()).device)
    tasks = prepare_tasks(section.icl_tasks, tok, model_seq_len(model))
    return evaluate_icl(tasks, model, tok, rank=env.rank, world_size=env.world_size,
                        subset_num_batches=section.icl_subset_num_batches, gauntlet=section.eval_gauntlet)


def _load_model_only(path: str) -> Any:
    from tessera.llm.hf.export import load_checkpoint_model

    return load_checkpoint_model(path)[0].eval()


@app.command()
def export(path: str = typer.Argument(..., metavar="CHECKPOINT"),
           out_url: str = typer.Argument(..., metavar="OUT", help="Folder or bucket URL for the export."),
           tokenizer: str = typer.Option(None, help="Tokenizer JSON or 'byte' (default: the run's)."),
           fmt: str = typer.Option("tessera", "--format", help="tessera (safetensors + Tessera's config.json) "
                                                               "or hf (a transformers folder; LoRA merged)."),
           adapter_only: bool = typer.Option(False, "--adapter-only", help="With --format hf: only the LoRA "
                                             "adapter, as PeftModel.from_pretrained(base, OUT) loads it."),
           allow_changed_base: bool = typer.Option(False, "--allow-changed-base", help="Export even if the "
                                                   "base model's files changed since the run started.")) -> None:
    """Save a checkpoint's model: Tessera's format, or with --format hf one transformers and peft load."""
    from tessera.llm.export import save_pretrained
    from tessera.llm.hf.mpt_load import load_gpt
    from tessera.llm.tokenizer import load_tokenizer

    if fmt not in ("tessera", "hf"):
        fail(ValueError(f"--format must be tessera or hf, got {fmt!r}"))
    if adapter_only and fmt != "hf":
        fail(ValueError("--adapter-only needs --format hf"))
    if fmt == "hf":
        from tessera.llm.hf.export import export_hf

        try:
            url = export_hf(path, out_url, adapter_only=adapter_only, allow_changed_base=allow_changed_base,
                            tokenizer=load_tokenizer(tokenizer) if tokenizer else None)
        except ERRORS as exc:
            fail(exc)
        err.print(f"exported {'the LoRA adapter' if adapter_only else 'a transformers model'} to {url}")
        return
    try:
        model, tok = load_gpt(path)  # a Tessera export or checkpoint, a Composer checkpoint, an MPT folder
        if tokenizer:
            tok = load_tokenizer(tokenizer)
        url = save_pretrained(model, out_url, tokenizer=tok)
    except ERRORS as exc:
        fail(exc)
    err.print(f"exported {model.num_params():,} parameters to {url}" + ("" if tok else " (no tokenizer)"))


@app.command()
def info(configs: list[str] = typer.Argument(None, help="Named configs (default: all)."),
         seq_len: int = typer.Option(None, help="Context length for FLOPs (default: the config's)."),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Parameters and training FLOPs per token of the named model configs (built on the meta device)."""
    import torch

    from tessera.llm.model import GPT, NAMED_CONFIGS, GPTConfig

    rows = []
    try:
        for name in configs or list(NAMED_CONFIGS):
            cfg = GPTConfig.named(name)
            with torch.device("meta"):
                model = GPT(cfg)
            length = seq_len or cfg.max_seq_len
            rows.append({"name": name, "params": model.num_params(), "seq_len": length,
                         "flops_per_token": model.flops_per_token(length), **cfg.to_dict()})
    except ERRORS as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table("config", "params", "d_model", "heads", "layers", "vocab", "seq", "train FLOPs/token")
    for r in rows:
        table.add_row(r["name"], f"{r['params'] / 1e6:,.1f}M", str(r["d_model"]), str(r["n_heads"]),
                      str(r["n_layers"]), f"{r['vocab_size']:,}", str(r["seq_len"]), f"{r['flops_per_token']:.3e}")
    out.print(table)
