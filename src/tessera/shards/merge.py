"""`merge_index`: one index.json over datasets written in parts (by parallel writers), as MosaicML's.

The merged index lists every part's shards in part order, each file's basename prefixed with the part's
folder (`part0/shard.00000.mds`), so readers of the merged folder find the files where they are: nothing
is copied. For the same parts its bytes are those of Mosaic's `streaming.base.util.merge_index`
(`{"version": 2, "shards": [...]}`, shard entries as the parts hold them). Differently from Mosaic, every
part's index is validated first, a basename listed twice is refused (its samples would be read twice),
a part below a sub-folder keeps its whole relative path, and index.json is written last, in one atomic
put: a failed merge leaves the previous index as it was.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.shards.errors import DatasetNotFound, IndexFormatError
from tessera.shards.index import INDEX_BASENAME, DatasetIndex
from tessera.storage import NotFound, RetryPolicy, Store, open_store

Part = str | os.PathLike[str] | tuple[str, str]
_FILE_KEYS = ("raw_data", "zip_data", "raw_meta", "zip_meta")


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
                download_timeout: float = 60) -> DatasetIndex:
    """Merge the indexes of `parts` (None: every folder below `out` with an index.json) into `out`."""
    retry = RetryPolicy(request_timeout=download_timeout)
    target = open_store(_pick(out, prefer_local=False), retry=retry)
    found = _discover(target) if parts is None else [_part(p, target, retry) for p in dict.fromkeys(parts)]
    if not found:
        raise DatasetNotFound(f"{target.url}: no part to merge (no folder below it holds an index.json)")
    shards: list[dict[str, Any]] = []
    owner: dict[str, str] = {}
    for store, prefix in found:
        for entry in _read_part(store):
            for key in _FILE_KEYS:
                if entry.get(key):
                    name = posixpath.join(prefix, entry[key]["basename"])
                    if name in owner:
                        raise IndexFormatError(target.url_for(INDEX_BASENAME), f"{name!r} would be listed twice "
                                               f"(from {owner[name]} and {store.url}); merge distinct parts")
                    owner[name] = store.url
                    entry[key]["basename"] = name
            shards.append(entry)
    text = json.dumps({"version": 2, "shards": shards})
    merged = DatasetIndex.from_json(text, target.url_for(INDEX_BASENAME))  # the same checks as any reader's
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


def _read_part(store: Store) -> list[dict[str, Any]]:
    """A part's shard entries as its index.json holds them (key order kept), after validating it."""
    label = store.url_for(INDEX_BASENAME)
    try:
        raw = store.get(INDEX_BASENAME)
    except NotFound:
        raise DatasetNotFound(f"{label}: no index.json; is the part written completely?") from None
    DatasetIndex.from_json(raw, label)
    return json.loads(raw)["shards"]
