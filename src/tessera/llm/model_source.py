"""What a model path names, decided in one place for training, eval, generation, export and plan alike.

    source = resolve_model_source("s3://bucket/models/llama")     # ModelSource(url, kind="transformers")
    source = resolve_model_source("runs/r1/checkpoints")          # kind="checkpoint"
    resolve_model_source("meta-llama/Meta-Llama-3-8B")            # NotAModel: not on this machine, how to place it

A source is one of three kinds, read from its `config.json` (a few bytes; no weights are read):

- `transformers`: a config.json with a `model_type` (a transformers folder, local or in a bucket);
- `export`: a config.json with `"format": "tessera-gpt"` (`tessera llm export`, llm/export.py);
- `checkpoint`: no config.json, but something there: a training checkpoint or a run's checkpoint root
  (whether it loads is the checkpoint reader's to say);
- `composer`: one file (local, or an object in a bucket) that `torch.save` wrote, a .tar, or a compressed
  file: a Composer checkpoint (LLM Foundry's `ep0-ba100-rank0.pt`; llm/hf/composer.py reads it).

Tessera never downloads from a model hub at run time, so a hub id (`org/name`) that is not a folder here
is refused with how to place the model, instead of a "no such folder" that reads like a typo.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tessera.storage import InvalidURL, NotFound, open_store, split_url

EXPORT_FORMAT = "tessera-gpt"  # the `format` of an export's config.json
DCP_METADATA = ".metadata"  # the index of a torch.distributed.checkpoint folder
CONFIG = "config.json"
Kind = Literal["transformers", "export", "checkpoint", "composer"]
# The first bytes of a compressed file: a compressed .pt, which the Composer reader refuses with what to do.
COMPRESSED_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"\x04\x22\x4d\x18": "lz4", b"BZh": "bzip2",
                    b"\xfd7zXZ": "xz"}
# The first bytes of a Composer checkpoint file: torch.save's zip archive or older pickle stream, a .tar,
# or a compressed one; (offset, magic).
_CHECKPOINT_FILE_MAGIC = ((0, b"PK\x03\x04"), (0, b"\x80"), (257, b"ustar"), *((0, m) for m in COMPRESSED_MAGIC))
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


class NotAModel(FileNotFoundError):
    """A model path that names no model here; the message is one line that says what to give instead."""


@dataclass(frozen=True)
class ModelSource:
    url: str
    kind: Kind
    config: dict[str, Any] | None = None  # its config.json (transformers, export); None for a checkpoint


def is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


def is_hub_id(url: str) -> bool:
    """`org/name`, as a model hub names a model (a relative path of two parts looks the same: the caller
    asks only once no such path exists)."""
    return _HUB_ID.fullmatch(url) is not None


def resolve_model_source(url: str | os.PathLike[str], key: str | None = None) -> ModelSource:
    """The kind of model `url` holds; NotAModel when it holds none. `key` (model.pretrained) is the recipe
    key that gave it, named in the error."""
    url = os.fspath(url)
    label = f"{key}={url}" if key else url
    if not is_remote(url):
        local = Path(url.removeprefix("file://")).expanduser()
        if not local.exists():
            if is_hub_id(url):
                raise NotAModel(hub_id_message(url, key))
            raise NotAModel(f"{label}: not a model: no such file or folder")
        if not local.is_dir():
            if is_checkpoint_file(url):
                return ModelSource(url, "composer")
            raise NotAModel(f"{label}: not a model: a file, not a folder (a transformers folder, a Tessera "
                            "export or a checkpoint folder), nor a Composer checkpoint file")
    store = open_store(url)
    try:
        config = json.loads(store.get(CONFIG))
    except NotFound:
        config = None
    except ValueError:
        raise NotAModel(f"{label}: not a model: its {CONFIG} is not JSON") from None
    if config is None:
        if store.exists(DCP_METADATA):
            raise NotAModel(sharded_composer_message(label))
        if is_remote(url) and next(iter(store.list("")), None) is None:
            if is_checkpoint_file(url):
                return ModelSource(url, "composer")
            raise NotAModel(f"{label}: not a model: no files there")
        return ModelSource(url, "checkpoint")
    if isinstance(config, dict) and "model_type" in config:
        return ModelSource(url, "transformers", config)
    if isinstance(config, dict) and config.get("format") == EXPORT_FORMAT:
        return ModelSource(url, "export", config)
    raise NotAModel(f"{label}: not a model: its {CONFIG} is neither a transformers config (no model_type) nor "
                    f"a Tessera export's (format {EXPORT_FORMAT})")


def is_checkpoint_file(url: str | os.PathLike[str]) -> bool:
    """Whether `url` names one file (local, or an object in a bucket) whose first bytes are a checkpoint
    file's (see `Kind`); False for a folder or nothing at all."""
    url = os.fspath(url)
    try:
        if is_remote(url):
            root, key = split_url(url)
            store = open_store(root)
            size = store.head(key).size
            head = store.get_range(key, 0, min(size, 262)) if size else b""
        else:
            local = Path(url.removeprefix("file://")).expanduser()
            if not local.is_file():
                return False
            with local.open("rb") as f:
                head = f.read(262)
    except (NotFound, InvalidURL):
        return False
    return any(head[offset:offset + len(magic)] == magic for offset, magic in _CHECKPOINT_FILE_MAGIC)


def is_sharded_composer(url: str | os.PathLike[str]) -> bool:
    """Whether `url` is a folder of torch.distributed.checkpoint shards (Composer's sharded checkpoint;
    Tessera's own keep theirs one level down, in a checkpoint's dcp/)."""
    url = os.fspath(url)
    if not is_remote(url) and not Path(url.removeprefix("file://")).expanduser().is_dir():
        return False
    try:
        return open_store(url).exists(DCP_METADATA)
    except (NotFound, InvalidURL):
        return False


def sharded_composer_message(label: str) -> str:
    """A sharded Composer checkpoint is refused: reading DCP's metadata unpickles it (runs code)."""
    return (f"{label}: a sharded Composer checkpoint (torch.distributed.checkpoint shards); Tessera reads "
            "Composer's one-file checkpoints: convert it where you trust it with `python -m "
            "torch.distributed.checkpoint.format_utils dcp_to_torch FOLDER composer.pt`")


def hub_id_message(hub_id: str, key: str | None = None) -> str:
    """One line: a hub id is not fetched; how to put the model where a path can name it."""
    name = hub_id.rsplit("/", 1)[-1]
    return (f"{key + ': ' if key else ''}model '{hub_id}' is not on this machine: Tessera does not download at "
            f"run time; place the model in a local folder (e.g. `hf download {hub_id} --local-dir ./{name}`) "
            "or a bucket path, and give that path")


def not_a_model(url: str, key: str | None = None) -> NotAModel:
    """A source that is there but loads as none of the kinds."""
    return NotAModel(f"{f'{key}={url}' if key else url}: not a model: neither a transformers folder (config.json "
                     "with a model_type, safetensors, tokenizer files) nor a Tessera export or checkpoint")
