"""A fingerprint of the base model a fine-tuning run started from, checked on resume and on export.

    fp = base_fingerprint(spec)                    # {"folder": ..., "digest": ..., "files": {name: digest}}
    check_base(saved_fp, spec, "runs/r1/checkpoints/ep0-ba40", override="--allow-changed-base")

A LoRA checkpoint holds only the adapters: resume and export read the frozen weights again from
`model.pretrained`. If that folder changed in between (a new upload under the same name, a file
re-saved), the adapters would silently land on other weights. So the run records, at its start, an
xxh3-128 hash of every file at the top of the model folder (weights, config.json, tokenizer files; not
READMEs, licences or subfolders such as a model's `original/` copy), and resume and export compare: a
difference is a `BaseModelChanged` error naming the folder and the files, unless overridden.

Hashing reads every weight byte once (xxh3 runs at memory speed; the disk sets the pace, and loading the
model reads the same bytes right after, from the page cache). A run hashes once per node: the first local
rank to take the lock hashes and records each file's hash in the model cache (`<cache>/.fingerprints/`)
keyed by the file's inode, size, mtime and ctime (any write changes ctime, which no copy tool can set);
the other ranks, and later starts, read the record and hash only files whose key changed. A remote model
is hashed in its local copy (hf/cache.py), which a changed upload replaces. A Tessera checkpoint used as the base is not fingerprinted
(its folder holds other checkpoints that change as it trains); its check is skipped.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import xxhash

from tessera.llm.hf.cache import default_cache_dir, is_remote, local_model_folder
from tessera.llm.hf.config import PretrainedSpec
from tessera.llm.model_source import resolve_model_source
from tessera.storage.local import write_atomic
from tessera.storage.locks import flocked
from tessera.train.callbacks import Callback

SKIPPED_SUFFIXES = (".md", ".txt", ".gitattributes", ".lock")
SKIPPED_NAMES = {"LICENSE", "LICENCE", "NOTICE", "USE_POLICY"}
CHUNK = 8 << 20
FINGERPRINT_KEY = "base_fingerprint"  # in the run config every checkpoint stores


class BaseModelChanged(ValueError):
    """`model.pretrained` no longer holds the weights the run was trained on."""


def fingerprinted_files(folder: Path) -> list[Path]:
    """The files whose bytes make the model: the folder's top-level files but documentation and hidden ones."""
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                  and p.name not in SKIPPED_NAMES and not p.name.endswith(SKIPPED_SUFFIXES))


def file_digest(path: Path) -> str:
    digest = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def folder_fingerprint(folder: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
                       ) -> dict[str, Any]:
    """{"digest": one hash over every file's name and hash, "files": {name: hash}} of a local model folder.
    With `cache_dir`, the hashes of files unchanged since the last call (same inode, size, mtime, ctime)
    are read from a record there, and the local ranks of a node hash one at a time (the first does it);
    a cache folder that cannot be written is passed over (every file is hashed)."""
    folder = Path(folder)
    records = Path(cache_dir).expanduser() / ".fingerprints" if cache_dir is not None else None
    if records is not None:
        try:
            records.mkdir(parents=True, exist_ok=True)
        except OSError:
            records = None
    if records is None or not os.access(records, os.W_OK):
        files = {p.name: file_digest(p) for p in fingerprinted_files(folder)}
    else:
        files = _recorded_digests(folder, records / f"{hashlib.sha256(os.fsencode(folder.resolve())).hexdigest()[:16]}.json")
    overall = xxhash.xxh3_128()
    for name, digest in files.items():
        overall.update(f"{name}\t{digest}\n".encode())
    return {"digest": overall.hexdigest(), "files": files}


def _recorded_digests(folder: Path, record: Path) -> dict[str, str]:
    """{name: hash} of the folder's files, hashing only those whose stat key differs from the record's."""
    with flocked(record.with_suffix(".lock"), fcntl.LOCK_EX):
        try:
            known = json.loads(record.read_text())
        except (OSError, ValueError):
            known = {}
        entries = {}
        for p in fingerprinted_files(folder):
            key, (seen_key, seen) = _stat_key(p), known.get(p.name) or (None, None)
            entries[p.name] = (key, seen if seen_key == key else file_digest(p))
        if entries != {name: tuple(entry) for name, entry in known.items()}:
            write_atomic(record, json.dumps(entries).encode())
    return {name: digest for name, (_, digest) in entries.items()}


def fingerprint_folder_of(spec: PretrainedSpec) -> Path | None:
    """The local folder to fingerprint for `model.pretrained`, None for a source that is not one
    (a Tessera checkpoint, or a remote Tessera export)."""
    url = spec.pretrained
    kind = resolve_model_source(url, "model.pretrained").kind
    if kind in ("checkpoint", "composer") or (kind == "export" and is_remote(url)):
        return None
    return local_model_folder(url, spec.cache_dir)


def base_fingerprint(spec: PretrainedSpec) -> dict[str, Any] | None:
    """What a run records of its base model (None when it is not fingerprinted, see the module docstring)."""
    folder = fingerprint_folder_of(spec)
    if folder is None:
        return None
    return {"folder": spec.pretrained, **folder_fingerprint(folder, spec.cache_dir or default_cache_dir())}


def changed_files(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    before, after = saved.get("files") or {}, now.get("files") or {}
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))


def check_base(saved: dict[str, Any] | None, spec: PretrainedSpec, where: str, override: str,
               now: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Raise `BaseModelChanged` if the base `spec` names differs from the one fingerprinted in `saved`
    (a checkpoint's record; None: nothing recorded, nothing to check). Returns the current fingerprint.
    `override` is how the user proceeds anyway, named in the message."""
    if not saved:
        return now
    now = now if now is not None else base_fingerprint(spec)
    if now is None or now.get("digest") == saved.get("digest"):
        return now
    files = changed_files(saved, now)
    shown = ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
    raise BaseModelChanged(f"model.pretrained={spec.pretrained} is not the base {where} was trained on "
                           f"(changed: {shown or 'the files'}); restore that model folder, or {override} "
                           "to use the adapters on this one")


class BaseCheck(Callback):
    """Refuses to continue a run whose resumed checkpoint was trained on another base (on_fit_start runs
    after the Trainer loaded it; `trainer.resumed` is that checkpoint's URL and config)."""

    def __init__(self, spec: PretrainedSpec, now: dict[str, Any] | None) -> None:
        self.spec, self.now = spec, now

    def on_fit_start(self, trainer: Any) -> None:
        resumed = getattr(trainer, "resumed", None)
        if resumed is None or self.spec.allow_changed_base:
            return
        check_base(resumed["config"].get(FINGERPRINT_KEY), self.spec, resumed["url"],
                   "set model.allow_changed_base=true", now=self.now)
