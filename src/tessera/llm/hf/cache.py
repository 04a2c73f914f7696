"""A Hugging Face model folder in a bucket, downloaded once per node into a local cache.

    folder = local_model_folder("s3://bucket/models/llama-3-8b")   # a local Path; local paths pass through

transformers reads models from local files only (Tessera never asks a model hub), so a remote folder is
copied whole to `<cache>/<name>-<fingerprint>/` first. The fingerprint hashes the URL and every object's
key, size and ETag, so a changed upload gets a new folder and an unchanged one is never fetched twice.
The local ranks of a node share the copy: the first to take the folder's lock downloads into a
temporary folder and renames it into place (atomic), the others wait on the lock and find it done
(storage/locks.filled_once: a download killed midway leaves no lock that blocks, and its partial
folder is removed by the next one).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tessera.llm.model_source import is_remote
from tessera.progress import WorkProgress
from tessera.storage import download_from, open_store
from tessera.storage.locks import filled_once

CACHE_ENV = "TESSERA_MODEL_CACHE"


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tessera" / "models")


def local_model_folder(url: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """`url` itself if it is a local folder, else its cached local copy (downloaded if not there yet)."""
    url = os.fspath(url)
    if not is_remote(url):
        folder = Path(url.removeprefix("file://")).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"{url}: no such model folder (model.pretrained)")
        return folder
    store = open_store(url)
    objects = sorted(store.list(""), key=lambda o: o.key)
    if not objects:
        raise FileNotFoundError(f"{url}: no files there (model.pretrained)")
    digest = hashlib.sha256(url.encode())
    for obj in objects:
        digest.update(f"\n{obj.key}\t{obj.size}\t{obj.etag or ''}".encode())
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", url.rstrip("/").rsplit("/", 1)[-1]) or "model"
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)

    def fill(partial: Path) -> None:
        with WorkProgress(f"downloading {name}", unit="bytes", total=sum(o.size for o in objects)) as progress:
            for obj in objects:
                download_from(store, obj.key, partial / obj.key, size=obj.size, progress=progress.advance)

    return filled_once(root / f"{name}-{digest.hexdigest()[:16]}", fill)
