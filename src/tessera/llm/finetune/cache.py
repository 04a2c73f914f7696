"""Prepare a recipe's fine-tuning file once, into a local MDS cache shared by the ranks of a node.

The cache folder is `<prep_cache>/<key>/`, where the key hashes the input's content (local files: their
bytes; objects in a bucket: URL, size and ETag), the tokenizer (`ExampleTokenizer.fingerprint`), every
option that changes the rows, and the source file of a `preprocessing_fn`. A changed file, option or
function gets a new folder; an unchanged one is reused.

One process prepares (storage/locks.filled_once): every process takes an exclusive `flock` on
`.<key>.lock`; the first finds no folder and prepares into a temporary folder beside it, then renames it
to `<key>/` (atomic: a folder at `<key>/` is always complete, which makes it the marker). The others
block on the lock meanwhile (no polling) and then find the folder. A process killed mid-prep leaves
only a temporary folder, removed by the next one, and no lock (the kernel drops it).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tessera.llm.finetune.chat import ExampleTokenizer, load_example_tokenizer
from tessera.llm.finetune.prep import example_options, function_fingerprint, prep_examples, read_summary
from tessera.shards.inputs import is_url, list_input
from tessera.storage import open_store
from tessera.storage.locks import filled_once
from tessera.storage.url import split_url

CACHE_VERSION = 2  # bump when the rows written for the same input and options change
READ_BLOCK = 4 << 20


def default_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tessera" / "finetune"


def input_fingerprint(path: str) -> str:
    """A hash of the input's content: every file's bytes, or every object's URL, size and ETag."""
    h = hashlib.sha256()
    if is_url(path):
        for rel, url in list_input(path).files:
            parent, name = split_url(url)
            info = open_store(parent).head(name)
            h.update(f"{rel}\0{url}\0{info.size}\0{info.etag}\n".encode())
        return h.hexdigest()
    for rel, file in list_input(path).files:
        h.update(f"{rel}\0".encode())
        with open(file, "rb") as f:
            while block := f.read(READ_BLOCK):
                h.update(block)
    return h.hexdigest()


def cache_key(path: str, tokenizer: ExampleTokenizer, options: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps({"version": CACHE_VERSION, "input": input_fingerprint(path),
                                   "tokenizer": tokenizer.fingerprint(), **options}, sort_keys=True).encode())
    return h.hexdigest()[:24]


def prepared(path: str, tokenizer: Any, *, seq_len: int, cache_root: str | os.PathLike[str] | None = None,
             **options: Any) -> tuple[Path, dict[str, Any]]:
    """(the cache folder holding `train/` of the prepared examples, its prep summary); prepares on a miss.
    `options`: `ExampleOptions`' fields (format, loss_on, truncation, pack, text_field, on_bad_row...)."""
    tok = load_example_tokenizer(tokenizer)
    opts = example_options(**options)
    keyed = dict(seq_len=seq_len, **opts.model_dump())
    if opts.preprocessing_fn:  # its code makes the rows too: an edit of it is a new cache folder
        keyed["preprocessing_source"] = function_fingerprint(opts.preprocessing_fn)
    root = Path(cache_root) if cache_root else default_cache_root()
    root.mkdir(parents=True, exist_ok=True)

    def fill(partial: Path) -> None:  # a refused row leaves no half-prepared folder (filled_once)
        prep_examples(path, partial, tok, seq_len=seq_len, fmt=opts.format, **opts.model_dump(exclude={"format"}))
        (partial / "source.json").write_text(json.dumps({"path": path, **keyed}, indent=1))

    folder = filled_once(root / cache_key(path, tok, keyed), fill)
    return folder, read_summary(folder) or {}
