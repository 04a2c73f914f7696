"""Where a Foundry YAML names a model, tokenizer or dataset: a local path or a bucket, never a hub.

Foundry reads `EleutherAI/gpt-neox-20b` or `mosaicml/dolly_hhrlhf` from the Hugging Face hub; Tessera
never downloads at run time. A name that is not a folder (or file) here is refused in one line that
says how to place it and which override then names it, before anything starts. A bucket path
(s3://, gs://, az://) is kept as it is and read when the run starts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tessera.llm.foundry.errors import FoundryError, refuse
from tessera.llm.model_source import hub_id_message, is_remote
from tessera.storage import StorageError
from tessera.storage.url import parse_url

_BARE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def checked_url(value: object, key: str) -> str:
    """A bucket URL Tessera can open (s3://, gs://, az://...), else a refusal naming the scheme."""
    text = str(value)
    try:
        parse_url(text)
    except StorageError as exc:
        raise refuse(key, str(exc).split(": ", 1)[-1]) from None
    return text


def _here(value: object, key: str, what: str) -> str | None:
    """`value` if it is a bucket URL or a local path that exists, None if it reads as a hub name."""
    if not isinstance(value, str) or not value.strip():
        raise refuse(key, f"must name {what} (a local path or s3://...)", value)
    if is_remote(value):
        return checked_url(value, key)
    if Path(value.removeprefix("file://")).expanduser().exists():
        return value
    if not _BARE_NAME.fullmatch(value):
        raise refuse(key, "no such file or folder", value)
    return None


def model_path(value: object, key: str) -> str:
    """A model (or tokenizer) folder: local and present, or in a bucket; a hub name gets how to place it."""
    found = _here(value, key, "a model folder")
    if found is None:
        name = str(value).rsplit("/", 1)[-1]
        raise FoundryError(hub_id_message(str(value), key).replace(
            "and give that path", f"and give that path ({key}=./{name})"))
    return found


def dataset_path(value: object, key: str) -> str:
    """A dataset (JSONL, Parquet or MDS, a file or folder): local and present, or in a bucket."""
    found = _here(value, key, "a dataset")
    if found is None:
        name = str(value).rsplit("/", 1)[-1]
        raise refuse(key, f"dataset '{value}' is not on this machine: Tessera does not download at run time; "
                          f"place it as JSONL, Parquet or MDS (e.g. `hf download {value} --repo-type dataset "
                          f"--local-dir ./{name}`) or in a bucket, and give that path ({key}=./{name})")
    return found


def tokenizer_file(folder: str, key: str) -> str:
    """A local tokenizer folder must hold tokenizer.json (a fast tokenizer), which Tessera's GPT reads."""
    if not is_remote(folder) and Path(folder).is_dir() and not (Path(folder) / "tokenizer.json").is_file():
        raise refuse(key, "the folder has no tokenizer.json (save the tokenizer with transformers' fast "
                          "tokenizer: AutoTokenizer.from_pretrained(...).save_pretrained(folder))", folder)
    return folder


def split_of(root: str, split: str | None, key: str) -> str:
    """`root/split` when the split is a sub-folder or a file named after it (train.jsonl...), else root."""
    if split is None or is_remote(root):
        return root if split is None else f"{root.rstrip('/')}/{split}"
    base = Path(root)
    if (base / split).exists():
        return os.path.join(root, split)
    for suffix in (".jsonl", ".jsonl.gz", ".json", ".parquet"):
        if (base / f"{split}{suffix}").is_file():
            return os.path.join(root, f"{split}{suffix}")
    if base.is_file():
        return root
    raise refuse(key, f"holds no split '{split}' (a folder {split}/ or a file {split}.jsonl / {split}.parquet)",
                 root)
