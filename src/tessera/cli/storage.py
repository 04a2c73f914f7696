"""`tessera storage ls|cp|rm`: move bytes between any two places Tessera can read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import typer

from tessera.cli.console import err, fail
from tessera.progress import WorkProgress, human_bytes
from tessera.storage import StorageError, Store, copy_between, open_store, split_url
from tessera.storage.url import parse_url

app = typer.Typer(help="List, copy and remove objects in local folders and buckets.", no_args_is_help=True)


@app.command("ls")
def ls(url: str, as_json: bool = typer.Option(False, "--json", help="One JSON object per line.")) -> None:
    """List every object under URL (recursively) with its size."""
    try:
        store, count, total = open_store(url), 0, 0
        for info in store.list():
            count, total = count + 1, total + info.size
            if as_json:
                typer.echo(json.dumps({"key": info.key, "size": info.size, "url": store.url_for(info.key)}))
            else:
                typer.echo(f"{info.size:>14,}  {info.key}")
    except StorageError as exc:
        fail(exc)
    if not as_json:
        err.print(f"{count} objects, {human_bytes(total)}")


def _pairs(src: str, dst: str, recursive: bool) -> Iterator[tuple[Store, str, Store, str, int]]:
    """(src store, src key, dst store, dst key, size) for each object to copy."""
    if recursive:
        src_store, dst_store = open_store(src), open_store(dst)
        for info in src_store.list():
            yield src_store, info.key, dst_store, info.key, info.size
        return
    src_root, src_key = split_url(src)
    src_store = open_store(src_root)
    size = src_store.head(src_key).size
    dst_is_dir = dst.endswith("/") or (parse_url(dst).is_local and Path(dst).is_dir())
    dst_root, dst_key = (dst.rstrip("/"), src_key) if dst_is_dir else split_url(dst)
    yield src_store, src_key, open_store(dst_root), dst_key, size


@app.command("cp")
def cp(src: str, dst: str, recursive: bool = typer.Option(False, "-r", "--recursive",
                                                           help="Copy every object under SRC.")) -> None:
    """Copy SRC to DST; either side may be a local path or a bucket URL."""
    try:
        pairs = list(_pairs(src, dst, recursive))
        total = sum(p[4] for p in pairs)
        with WorkProgress(f"copying {len(pairs)} object(s)", err, unit="bytes", total=total) as bar:
            for src_store, src_key, dst_store, dst_key, _ in pairs:
                copy_between(src_store, src_key, dst_store, dst_key, progress=bar.advance)
    except StorageError as exc:
        fail(exc)
    err.print(f"copied {len(pairs)} object(s), {human_bytes(total)}")


@app.command("rm")
def rm(url: str, recursive: bool = typer.Option(False, "-r", "--recursive",
                                                help="Remove every object under URL.")) -> None:
    """Remove one object, or with -r every object under a prefix."""
    try:
        if recursive:
            store = open_store(url)
            keys = [info.key for info in store.list()]
            store.delete_many(keys)
            err.print(f"removed {len(keys)} object(s)")
            return
        root, key = split_url(url)
        store = open_store(root)
        if not store.exists(key):
            err.print(f"[red]error:[/red] {url}: no such object")
            raise typer.Exit(1)
        store.delete(key)
    except StorageError as exc:
        fail(exc)
