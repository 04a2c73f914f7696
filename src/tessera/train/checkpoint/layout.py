"""What a checkpoint folder holds: its layout, names, manifest and pointer; the errors and the report
of a save (`CheckpointInfo`) that describe one.

Layout under a run's save folder (any `open_store` URL):

    latest                      pointer: the name of the newest committed checkpoint (written last)
    ep1-ba500/
      meta.json                 format, timestamp, world size, sharded?, run config   (rank 0)
      model.pt                  model state dict                    (non-sharded, rank 0)
      train_state.pt            optimizers, schedulers, grad scaler (rank 0; no optimizers when sharded)
      dcp/.metadata, dcp/__R_0.distcp   model + optimizers through torch.distributed.checkpoint (sharded)
      rank{R}.pt                RNG state and dataloader state of rank R                  (every rank)
      rank{R}.done.json         rank R's uploaded files, for rank 0 to confirm            (every rank)
      manifest.json             every data file with size and xxh64: the commit marker    (rank 0, last)

A folder is committed when its `manifest.json` exists; it is valid when every file the manifest names
is present with the same size and hash. Names sort by (batch, epoch), newest last.

This module only names things and reads them back; writing them in the right order is `commit`'s job,
deleting them `retention`'s.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from tessera.storage import NotFound, Store
from tessera.train.time import Timestamp

FORMAT = "tessera.checkpoint/1"
MANIFEST = "manifest.json"
POINTER = "latest"
META = "meta.json"
MODEL = "model.pt"
TRAIN_STATE = "train_state.pt"
DCP_DIR = "dcp"
HASH = "xxh64"
log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"^ep(\d+)-ba(\d+)$")


class CheckpointError(Exception):
    """Base class for checkpoint problems; carries the URL of the checkpoint concerned."""

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class CheckpointCorrupt(CheckpointError):
    """A checkpoint is partial (no manifest), or a file is missing, has the wrong size or hash."""


class CheckpointNotFound(CheckpointError):
    """There is no checkpoint where one was expected."""


def none_usable(url: str, refused: list[str]) -> CheckpointCorrupt:
    """The error of an autoresume that found checkpoints under `url` but could use none: every one tried
    and why it was refused (`refused`, newest first), and the ways on. Refusing, rather than starting
    afresh, keeps a damaged bucket from silently costing the run its progress."""
    return CheckpointCorrupt(f"{url}: no usable checkpoint; tried {len(refused)}: {'; '.join(refused)}. Delete "
                             f"the damaged checkpoints (or the folder) to start afresh, or train with "
                             f"autoresume=false or another save_folder", url)


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (partial, damaged or missing) and an older one is used instead."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What `on_saved` callbacks receive once a rank's part of a save is done.

    On rank 0 `committed` is True (manifest and pointer written) and `files` lists every rank's files;
    on other ranks it lists this rank's uploads. Callbacks run on the background save thread.
    """

    name: str
    url: str
    timestamp: Timestamp
    rank: int
    committed: bool
    files: tuple[ManifestEntry, ...]
    bytes: int
    stall_seconds: float
    write_seconds: float
    deleted: tuple[str, ...] = ()


def rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


def done_file(rank: int) -> str:
    return f"rank{rank}.done.json"


def checkpoint_name(timestamp: Timestamp) -> str:
    """The folder name of a checkpoint taken at `timestamp`: "ep{epoch}-ba{batch}"."""
    return f"ep{timestamp.epoch}-ba{timestamp.batch}"


def name_order(name: str) -> tuple[int, int] | None:
    """The sort key (batch, epoch) of a checkpoint folder name, or None if it is not one."""
    match = _NAME_RE.match(name)
    return None if match is None else (int(match[2]), int(match[1]))


def is_checkpoint_name(name: str) -> bool:
    return name_order(name) is not None


@dataclass(frozen=True)
class ManifestEntry:
    """One file of a checkpoint: its key relative to the checkpoint folder, size and xxh64 hex."""

    key: str
    size: int
    xxh64: str


@dataclass
class CheckpointManifest:
    """The commit record of one checkpoint (`manifest.json`)."""

    name: str
    timestamp: dict[str, int]
    world_size: int
    sharded: bool
    files: list[ManifestEntry]
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    format: str = FORMAT

    def to_json(self) -> bytes:
        body = asdict(self)
        body["files"] = sorted(body["files"], key=lambda e: e["key"])
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, url: str) -> CheckpointManifest:
        try:
            body = json.loads(data)
        except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
            raise CheckpointCorrupt(f"{url}: unreadable manifest: not JSON ({exc})", url) from None
        try:
            files = [ManifestEntry(str(e["key"]), int(e["size"]), str(e[HASH])) for e in body["files"]]
            timestamp = {str(unit): int(count) for unit, count in dict(body["timestamp"]).items()}
            manifest = cls(name=str(body["name"]), timestamp=timestamp,
                           world_size=int(body["world_size"]), sharded=bool(body["sharded"]), files=files,
                           created=str(body.get("created", "")), format=str(body["format"]))
        except KeyError as exc:
            raise CheckpointCorrupt(f"{url}: unreadable manifest: no {exc} key", url) from None
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:
            raise CheckpointCorrupt(f"{url}: unreadable manifest ({exc})", url) from None
        if manifest.format != FORMAT:
            raise CheckpointCorrupt(f"{url}: unknown checkpoint format {manifest.format!r} "
                                    f"(this Tessera reads {FORMAT!r})", url)
        return manifest

    def entries(self) -> dict[str, ManifestEntry]:
        return {e.key: e for e in self.files}


def list_checkpoints(store: Store) -> dict[str, dict[str, int]]:
    """Checkpoint folders under `store`: name -> {key inside the folder: size}."""
    folders: dict[str, dict[str, int]] = {}
    for info in store.list(""):
        top, _, rest = info.key.partition("/")
        if rest and is_checkpoint_name(top):
            folders.setdefault(top, {})[rest] = info.size
    return folders


def newest_first(names: Iterable[str]) -> list[str]:
    return sorted((n for n in names if is_checkpoint_name(n)), key=name_order, reverse=True)


def read_pointer(store: Store) -> str | None:
    """The checkpoint name `latest` points to, or None if there is no pointer."""
    try:
        return store.get(POINTER).decode().strip() or None
    except NotFound:
        return None
    except UnicodeDecodeError:
        return None


def resume_order(store: Store, warn: Callable[[str], None]) -> tuple[list[str], bool]:
    """The folders to try when resuming: the pointer's target first, then every other checkpoint
    folder, newest first; and whether any save was ever committed (a pointer or a manifest exists).
    Without one, every folder is a save that died before its commit, and the run starts from the
    beginning. `warn` hears about folders newer than the pointer that are skipped."""
    folders = list_checkpoints(store)
    ordered = newest_first(folders)
    pointer = read_pointer(store)
    committed = pointer is not None or any(MANIFEST in files for files in folders.values())
    if pointer is None:
        return ordered, committed
    if pointer not in folders:
        warn(f"{store.url_for(POINTER)} names {pointer!r}, which is missing from the store; "
                   f"trying the newest remaining checkpoint")
        return ordered, committed
    for name in ordered:
        if name_order(name) <= name_order(pointer):
            break
        if MANIFEST not in folders[name]:  # a save that died before its commit
            warn(f"checkpoint {store.url_for(name)} is newer than {POINTER} but incomplete (no "
                       f"{MANIFEST}: the save did not finish); resuming from {pointer}")
        else:  # died between manifest and pointer: the pointer is the commit, so it is not used
            log.info("checkpoint %s has a manifest but %s never moved to it; resuming from %s",
                     store.url_for(name), POINTER, pointer)
    return [pointer] + [n for n in ordered if n != pointer], committed


def read_manifest(store: Store, name: str) -> CheckpointManifest:
    """The manifest of checkpoint `name`; CheckpointCorrupt if it is missing (partial save) or unreadable."""
    url = store.url_for(f"{name}/{MANIFEST}")
    try:
        data = store.get(f"{name}/{MANIFEST}")
    except NotFound:
        raise CheckpointCorrupt(f"{store.url_for(name)}: no {MANIFEST}, so the save did not finish "
                                f"(partial checkpoint)", store.url_for(name)) from None
    manifest = CheckpointManifest.from_json(data, url)
    if manifest.name != name:
        raise CheckpointCorrupt(f"{url}: the manifest is for {manifest.name!r}, not {name!r}", url)
    return manifest


def check_sizes(store: Store, name: str, manifest: CheckpointManifest, present: dict[str, int]) -> None:
    """Every file of the manifest is in `present` (key -> size, from a listing) with the right size."""
    for entry in manifest.files:
        url = store.url_for(f"{name}/{entry.key}")
        if entry.key not in present:
            raise CheckpointCorrupt(f"{url}: missing (named in {MANIFEST})", url)
        if present[entry.key] != entry.size:
            raise CheckpointCorrupt(f"{url}: {present[entry.key]} bytes, but {MANIFEST} says {entry.size} "
                                    f"(truncated or overwritten)", url)


def parse_done(data: bytes) -> tuple[str, list[ManifestEntry]]:
    """(save nonce, files) from a rank's `rank{R}.done.json`."""
    body = json.loads(data)
    return str(body["nonce"]), [ManifestEntry(e["key"], int(e["size"]), e[HASH]) for e in body["files"]]


def make_done(nonce: str, files: list[ManifestEntry]) -> bytes:
    return json.dumps({"nonce": nonce, "files": [asdict(e) for e in files]}).encode()


def meta_json(name: str, timestamp: Timestamp, world_size: int, sharded: bool, config: Any) -> bytes:
    """meta.json: what a person or the platform wants to know without loading torch files."""
    body = {"format": FORMAT, "name": name, "timestamp": timestamp.state_dict(), "world_size": world_size,
            "sharded": sharded, "config": config}
    try:
        return json.dumps(body, indent=1, sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the run config must be JSON-serialisable to go into {META} ({exc}); convert "
                        f"paths, enums and objects to strings or plain dicts first") from None
