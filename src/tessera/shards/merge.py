"""`merge_index`: one index.json over datasets written in parts (by parallel writers), as MosaicML's.

The merged index lists every part's shards in part order, each file's basename prefixed with the part's
folder (`part0/shard.00000.mds`), so readers of the merged folder find the files where they are: nothing
is copied. For the same parts its bytes are those of Mosaic's `streaming.base.util.merge_index`
(`{"version": 2, "shards": [...]}`, shard entries as the parts hold them). Differently from Mosaic, every
part's index is validated first, a basename listed twice is refused (its samples would be read twice),
a part below a sub-folder keeps its whole relative path, and index.json is written last, in one atomic
put: a failed merge leaves the previous index as it was.

Parallel conversion (Ray, Spark) leaves hundreds of parts: their index.json are fetched FETCHES at a time
through the storage layer, each validated once as it arrives, and merged in part order, so the result is
byte for byte the one-at-a-time merge's. The merged text is built part by part and not parsed again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tessera.shards.errors import DatasetNotFound, IndexFormatError
from tessera.shards.index import (
    _FILE_KEYS,
    INDEX_BASENAME,
    DatasetIndex,
    FileInfo,
    check_basename,
    check_total_samples,
    parse_json,
    shard_key,
)
from tessera.shards.pool import ordered_map
from tessera.storage import NotFound, RetryPolicy, Store, open_store

Part = str | os.PathLike[str] | tuple[str, str]
FETCHES = 16  # part indexes fetched at once


def merge_index(*args: Any, **kwargs: Any) -> DatasetIndex:
    """Merge the index.json files of a dataset's parts into `out`/index.json; returns the merged index.

    Called as MosaicML's: `merge_index(index_file_urls, out, keep_local=True, download_timeout=60)`
    (each URL a part's index.json or folder, local or remote, or a (local, remote) pair: the local one
    when it exists), or `merge_index(out, keep_local=True, download_timeout=60)` to merge every folder
    below `out` holding an index.json. `out` is a folder or URL, or a (local, remote) pair: the merged
    index goes to the remote, and also to the local folder when `keep_local`.
    """
    if args and isinstance(args[0], list) and len(args) + len(kwargs) in (2, 3, 4):
        return merge_parts(*args, **kwargs)
    if args and isinstance(args[0], str | tuple | os.PathLike) and len(args) + len(kwargs) in (1, 2, 3):
        return merge_parts(None, *args, **kwargs)
    raise ValueError(f"invalid arguments to merge_index: {args}, {kwargs}; pass (index_file_urls, out) or (out)")


def merge_parts(parts: Sequence[Part] | None, out: Part, keep_local: bool = True,
                download_timeout: float = 60, concurrency: int = FETCHES) -> DatasetIndex:
    """Merge the indexes of `parts` (None: every folder below `out` with an index.json) into `out`.

    The parts' index.json are fetched `concurrency` at a time (threads through the storage layer; one
    GET after another took ~1,000 round trips for 1,000 parts), and merged in part order as they come."""
    retry = RetryPolicy(request_timeout=download_timeout)
    target = open_store(_pick(out, prefer_local=False), retry=retry)
    found = _discover(target) if parts is None else [_part(p, target, retry) for p in dict.fromkeys(parts)]
    if not found:
        raise DatasetNotFound(f"{target.url}: no part to merge (no folder below it holds an index.json)")
    label = target.url_for(INDEX_BASENAME)
    merged, pieces = DatasetIndex(), []
    owner: dict[tuple[str, str], str] = {}  # (part folder, basename) of each file -> the part listing it
    for (store, prefix), (index, entries) in zip(found, _read_parts([s for s, _ in found], concurrency),
                                                 strict=True):
        check_basename(posixpath.join(prefix, "_"), label)  # the part's own basenames were checked with it
        folder = shard_key(prefix)
        for entry, raw in zip(index.shards, entries, strict=True):
            renamed = {}
            for key in _FILE_KEYS:
                if raw.get(key):
                    name = posixpath.join(prefix, raw[key]["basename"])
                    if (folder, raw[key]["basename"]) in owner:
                        raise IndexFormatError(label, f"{name!r} would be listed twice (from "
                                               f"{owner[folder, raw[key]['basename']]} and {store.url}); merge "
                                               "distinct parts")
                    owner[folder, raw[key]["basename"]] = store.url
                    raw[key]["basename"] = name
                    info = getattr(entry, key)
                    renamed[key] = FileInfo(name, info.bytes, info.hashes)
            merged.shards.append(dataclasses.replace(entry, **renamed))
        if entries:  # the bytes json.dumps({"version": 2, "shards": all entries}) gives, part by part
            pieces.append(json.dumps(entries)[1:-1])
    check_total_samples(merged.num_samples, label)  # each part's entries were checked as every reader does
    text = '{"version": 2, "shards": [' + ", ".join(pieces) + "]}"
    target.put(INDEX_BASENAME, text.encode("utf-8"))
    if isinstance(out, tuple) and keep_local:
        open_store(out[0]).put(INDEX_BASENAME, text.encode("utf-8"))
    return merged


def _pick(where: Part, prefer_local: bool) -> str:
    """A path or URL; of a (local, remote) pair, the local one when asked and it exists, else the remote."""
    if isinstance(where, tuple):
        local, remote = where
        return local if prefer_local and Path(local).exists() else remote
    return os.fspath(where)


def _discover(target: Store) -> list[tuple[Store, str]]:
    """Every folder below `target` holding an index.json, in key order (as Mosaic lists them)."""
    keys = sorted(info.key for info in target.list() if info.key.endswith("/" + INDEX_BASENAME))
    return [(target.child(posixpath.dirname(key)), posixpath.dirname(key)) for key in keys]


def _part(part: Part, target: Store, retry: RetryPolicy) -> tuple[Store, str]:
    """A given part's store and the prefix of its basenames: its path relative to `target` when it lies
    below it, else (as Mosaic) its folder's name."""
    url = _pick(part, prefer_local=True).rstrip("/").strip()
    if url.endswith("/" + INDEX_BASENAME) or url == INDEX_BASENAME:
        url = url[: -len(INDEX_BASENAME)].rstrip("/") or "."
    store = open_store(url, retry=retry)
    root = target.url.rstrip("/") + "/"
    prefix = store.url[len(root):] if store.url.startswith(root) else posixpath.basename(store.url.rstrip("/"))
    if not prefix or prefix.startswith("."):
        raise ValueError(f"{store.url}: a part must be a folder below or beside {target.url}, not {target.url} "
                         "itself")
    return store, prefix


def _read_parts(stores: list[Store], concurrency: int) -> Iterator[tuple[DatasetIndex, list[dict[str, Any]]]]:
    """Each part's index, validated, and its shard entries as its index.json holds them (key order kept),
    in order. Up to `concurrency` GETs run at once, no more than twice that many parts ahead of the
    merge; the parsing stays in this thread (threads would only take turns at it)."""
    if concurrency <= 1:
        yield from (_parse_part(store, _get_part(store)) for store in stores)
        return
    with ThreadPoolExecutor(min(concurrency, len(stores)), thread_name_prefix="tessera-merge") as pool:
        fetched = ordered_map(pool, _get_part, ((store,) for store in stores), 2 * concurrency)
        yield from (_parse_part(store, raw) for store, raw in zip(stores, fetched, strict=True))


def _get_part(store: Store) -> bytes:
    try:
        return store.get(INDEX_BASENAME)
    except NotFound:
        raise DatasetNotFound(f"{store.url_for(INDEX_BASENAME)}: no index.json; is the part written "
                              "completely?") from None


def _parse_part(store: Store, raw: bytes) -> tuple[DatasetIndex, list[dict[str, Any]]]:
    """The part's index, validated, and the entries it was made from (the text parsed once)."""
    label = store.url_for(INDEX_BASENAME)
    obj = parse_json(raw, label)
    return DatasetIndex.from_obj(obj, label), obj["shards"]
