"""`tessera data convert|inspect|head|verify|repair`: make and check MDS datasets, local or in a bucket."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table

from tessera.cli.console import err, fail, out
from tessera.progress import WorkProgress
from tessera.shards import MDSDataset, ShardError, repair_index
from tessera.shards.convert import convert as run_convert
from tessera.shards.dataset import open_dataset_store
from tessera.shards.errors import DatasetExists
from tessera.shards.interrupted import Interrupted, InterruptedWrite
from tessera.shards.merge import merge_parts
from tessera.shards.session import JOURNAL_BASENAME
from tessera.shards.sources import FORMATS, SourceError, parse_columns
from tessera.shards.verify import packed_index, verify_dataset
from tessera.storage import StorageError

app = typer.Typer(help="Convert data to MDS shards and inspect, verify or repair datasets.", no_args_is_help=True)
ERRORS = (ShardError, StorageError, SourceError, ValueError, FileNotFoundError)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


@app.command()
def convert(input: str = typer.Argument(..., help="File or folder, or bucket URL (one object or a prefix), to convert."),
            out_url: str = typer.Argument(..., metavar="OUT", help="Output folder or bucket URL."),
            fmt: str = typer.Option(None, "--format", help=f"Input format: {', '.join(FORMATS)} (guessed)."),
            columns: str = typer.Option(None, help="NAME:ENCODING,... (inferred from the first sample)."),
            compression: str = typer.Option(None, help="e.g. zstd, zstd:7, br, gz, bz2, snappy."),
            hashes: str = typer.Option(None, help="Comma-separated hash algorithms, e.g. xxh64,sha1."),
            size_limit: str = typer.Option("64mb", help="Shard size limit (bytes or 64mb)."),
            workers: int = typer.Option(1, help="Processes that read and encode the input (same dataset for any N)."),
            mode: str = typer.Option("create", help="create | append | resume | overwrite."),
            text_field: str = typer.Option(None, help="Keep only this field (as 'text')."),
            engine: str = typer.Option("local", help="local (processes here) | ray (Ray tasks, one part each)."),
            address: str = typer.Option(None, help="--engine ray: the cluster (default: start a local Ray)."),
            as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Convert JSONL, Parquet, CSV/TSV, text files or an image folder to an MDS dataset."""
    if engine not in ("local", "ray"):
        fail(f"--engine must be local or ray, got {engine!r}")
    if address and engine != "ray":
        fail("--address needs --engine ray")
    try:
        cols = parse_columns(columns) if columns else None
        algos = [h.strip() for h in hashes.split(",")] if hashes else None
        # samples written so far (the total is known at the end); no refresh thread: `convert` may fork its workers
        with WorkProgress("converting samples", err) as bar:
            options = dict(fmt=fmt, columns=cols, compression=compression, hashes=algos, size_limit=size_limit,
                           workers=workers, mode=mode, text_field=text_field,
                           progress=lambda samples, chunks: bar.update(samples))
            if engine == "ray":
                from tessera.shards.ray_engine import convert_on_ray

                summary = convert_on_ray(input, out_url, address=address, **options)
            else:
                summary = run_convert(input, out_url, **options)
    except DatasetExists as exc:
        fail(exc.for_cli())
    except ERRORS as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps({**summary.__dict__, "samples_per_second": summary.samples_per_second,
                               "mb_per_second": summary.mb_per_second}))
        return
    if summary.status != "written":
        done = "already complete" if summary.status == "complete" else "finished the interrupted commit"
        err.print(f"{done}: {summary.samples:,} samples in {summary.shards} shards; nothing to do", soft_wrap=True)
        return
    err.print("columns: " + ", ".join(f"{k}:{v}" for k, v in summary.columns.items()))
    err.print(f"wrote {summary.samples:,} samples in {summary.shards} shards to {summary.out}: "
              f"{_mb(summary.raw_bytes)} raw, {_mb(summary.stored_bytes)} stored, {summary.seconds:.1f}s "
              f"({summary.samples_per_second:,.0f} samples/s, {summary.mb_per_second:,.1f} MB/s)")


def _describe(url: str, split: str | None) -> dict[str, Any]:
    """inspect's figures from the packed index (packed_index.py: arrays, no object per shard)."""
    store = open_dataset_store(url, split)
    with tempfile.TemporaryDirectory(prefix="tessera-inspect-") as tmp:
        packed = packed_index(store, Path(tmp))
        none = np.zeros(len(packed), np.int64)
        raw, zipped = packed.bytes_of("raw_data"), packed.bytes_of("zip_data")
        raw = none if raw is None else raw
        stored = raw if zipped is None else np.where(zipped >= 0, zipped, raw)
        formats: Counter[str] = Counter()
        used = []
        for layout, count in zip(packed.layouts, np.bincount(packed.layout_ids, minlength=len(packed.layouts)),
                                 strict=True):
            if count:
                formats[layout.format] += int(count)
                used.append(layout)
        first = packed[0] if len(packed) else None
        return {
            "url": store.url, "samples": int(packed.samples.sum()), "shards": len(packed),
            "columns": dict(zip(first.column_names, first.column_encodings, strict=True)) if first else {},
            "formats": dict(formats), "compression": sorted({layout.compression or "none" for layout in used}),
            "hashes": sorted({h for layout in used for h in layout.hashes}),
            "raw_bytes": int(raw.sum()), "stored_bytes": int(stored.sum()),
            "compression_ratio": int(raw.sum()) / int(stored.sum()) if stored.sum() else 1.0,
            "extensions": sorted(packed.extensions),
        }


WORKERS_HELP = "Processes that check the shards (default: one per CPU from 512 shards)."


@app.command()
def inspect(url: str, split: str = typer.Option(None, help="Sub-folder holding the split's index.json."),
            as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Samples, shards, columns and encodings, raw and stored bytes, compression ratio."""
    try:
        info = _describe(url, split)
    except ERRORS as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(info))
        return
    table = Table(title=info["url"], show_header=False)
    for key in ("samples", "shards", "compression", "hashes"):
        table.add_row(key, f"{info[key]:,}" if isinstance(info[key], int) else ", ".join(info[key]) or "-")
    table.add_row("columns", ", ".join(f"{k}: {v}" for k, v in info["columns"].items()))
    table.add_row("raw / stored", f"{_mb(info['raw_bytes'])} / {_mb(info['stored_bytes'])} "
                                  f"(ratio {info['compression_ratio']:.2f})")
    out.print(table)


def _show(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return f"ndarray{list(value.shape)} {value.dtype} {np.array2string(value.reshape(-1)[:8], separator=',')}..."
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + "..."
    if hasattr(value, "size") and hasattr(value, "mode"):
        return f"<image {value.mode} {value.size[0]}x{value.size[1]}>"
    return value.item() if isinstance(value, np.generic) else value


@app.command()
def head(url: str, n: int = typer.Option(5, "-n", help="How many samples."),
         split: str = typer.Option(None), allow_unsafe_types: bool = typer.Option(False)) -> None:
    """Print the first N samples."""
    try:
        ds = MDSDataset(url, split, allow_unsafe_types=allow_unsafe_types)
        for i in range(min(n, len(ds))):
            typer.echo(json.dumps({k: _show(v) for k, v in ds[i].items()}, default=str))
    except ERRORS as exc:
        fail(exc)


@app.command()
def verify(url: str, split: str = typer.Option(None), quick: bool = typer.Option(
        False, help="Check sizes, hashes and headers only; do not decode every sample."),
        allow_unsafe_types: bool = typer.Option(False),
        index_only: bool = typer.Option(False, help="Check index.json alone, not the shard files."),
        workers: int = typer.Option(None, min=1, help=WORKERS_HELP),
        progress_every: float = typer.Option(5.0, min=0, help="Without a terminal: seconds between progress "
                                                              "lines.")) -> None:
    """Check every shard's size, hashes and structure; exit 1 and list each problem if any."""
    with WorkProgress("verifying shards", err, every=progress_every) as bar:
        report = verify_dataset(url, split, decode=not quick, allow_unsafe_types=allow_unsafe_types,
                                progress=bar.update, index_only=index_only, workers=workers)
    if report.index_error is not None:
        fail(report.index_error)
    for problem in report.problems:  # one line each (no wrapping), brackets kept (no markup)
        err.print(f"[red]problem:[/red] {escape(problem)}", soft_wrap=True)
    if not report.ok:
        err.print(f"{len(report.problems)} problem(s) in {report.url}")
        raise typer.Exit(1)
    what = "index.json of " if index_only else ""
    err.print(f"ok: {what}{report.shards:,} shards, {report.samples:,} samples in {report.url}", soft_wrap=True)


@app.command()
def repair(url: str, split: str = typer.Option(None), overwrite: bool = typer.Option(
        False, help="Replace an existing index.json."), skip_bad: bool = typer.Option(
        False, help="Leave out shards that fail validation."), dry_run: bool = typer.Option(False),
        allow_partial: bool = typer.Option(
            False, help="Commit an index of the shards present even though a write was interrupted.")) -> None:
    """Rebuild a lost index.json from the shard files (each shard embeds its config).

    Refuses (exit 1) when a write was interrupted, unless --allow-partial: the shards are then only part
    of the data, and `tessera data convert ... --mode resume` finishes the write instead."""
    try:
        report = repair_index(url, split, overwrite=overwrite, skip_bad=skip_bad, dry_run=dry_run,
                              allow_partial=allow_partial)
    except InterruptedWrite as exc:
        _interrupted(exc.url, exc.found)
        raise typer.Exit(1) from None
    except DatasetExists as exc:
        fail(exc.for_cli())
    except ERRORS as exc:
        fail(exc)
    for name, why in report.skipped:
        err.print(f"[yellow]skipped[/yellow] {name}: {why}")
    verb = "rebuilt" if report.written else "would write"
    partial = "a PARTIAL " if report.interrupted else ""
    err.print(f"{verb} {partial}index.json: {len(report.index.shards)} shards, {report.index.num_samples:,} samples")
    if report.interrupted:
        err.print("[yellow]the write was interrupted:[/yellow] its journal is kept; `tessera data convert INPUT "
                  f"{url} --mode resume` can still finish it and replace this index")


@app.command("merge-index")
def merge_index(out_url: str = typer.Argument(..., metavar="OUT", help="Folder or bucket URL for the merged index.json."),
                parts: list[str] = typer.Argument(None, metavar="PARTS", help="Part folders (or their index.json); "
                                                  "default: every folder below OUT holding an index.json.")) -> None:
    """Merge the index.json of dataset parts (written in parallel) into OUT/index.json, as MosaicML's merge_index."""
    try:
        index = merge_parts(parts or None, out_url)
    except ERRORS as exc:
        fail(exc)
    err.print(f"merged {len(index.shards):,} shards ({index.num_samples:,} samples) into "
              f"{escape(out_url.rstrip('/'))}/index.json", soft_wrap=True)


def _interrupted(url: str, found: Interrupted) -> None:
    """What an interrupted write left, what is complete, and what to run (stderr, several lines)."""
    what = "finished but its commit was interrupted" if found.state == "committing" else "was interrupted"
    err.print(f"[red]error:[/red] {escape(url)}: a write {what} ({JOURNAL_BASENAME} is present); "
              "nothing was committed", soft_wrap=True)
    last = f", the last {escape(found.last)}" if found.last else ""
    err.print(f"  complete: {found.shards} shards confirmed, {found.samples:,} samples{last}; "
              f"{found.files} shard files stored", soft_wrap=True)
    err.print(f"  to finish: tessera data convert INPUT {escape(url)} --mode resume (same options; keeps the "
              "confirmed shards)", soft_wrap=True)
    err.print(f"  or: tessera data repair {escape(url)} --allow-partial to commit the complete prefix as a "
              "partial dataset", soft_wrap=True)
