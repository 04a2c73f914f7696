"""The store side of checkpoints: folder layout, manifest, commit, verification and retention.

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

Nothing here knows about torch or threads: `upload_folder`, `wait_for_ranks`, `commit`, `prune` and
`fetch` are plain functions over a `Store`, called by `CheckpointManager`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import xxhash

from tessera.storage import IntegrityError, NotFound, Store, download_from, hash_file
from tessera.train.time import Timestamp

FORMAT = "tessera.checkpoint/1"
MANIFEST = "manifest.json"
POINTER = "latest"
META = "meta.json"
MODEL = "model.pt"
TRAIN_STATE = "train_state.pt"
DCP_DIR = "dcp"
HASH = "xxh64"
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
            files = [ManifestEntry(str(e["key"]), int(e["size"]), str(e[HASH])) for e in body["files"]]
            manifest = cls(name=str(body["name"]), timestamp=dict(body["timestamp"]),
                           world_size=int(body["world_size"]), sharded=bool(body["sharded"]), files=files,
                           created=str(body.get("created", "")), format=str(body["format"]))
        except (ValueError, KeyError, TypeError) as exc:
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


# --- the store side of save and load -----------------------------------------------------------------


def upload_folder(folder: Store, local: Path, threads: int = 4) -> list[ManifestEntry]:
    """Upload every file under `local` to `folder` (same relative keys); their sizes and hashes."""
    paths = sorted(p for p in local.rglob("*") if p.is_file())

    def one(path: Path) -> ManifestEntry:
        key = path.relative_to(local).as_posix()
        entry = ManifestEntry(key, path.stat().st_size, hash_file(path, HASH))
        folder.put_file(key, path)
        return entry

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, paths))


def wait_for_ranks(folder: Store, nonce: str, ranks: Iterable[int], timeout: float) -> list[ManifestEntry]:
    """The files of every rank in `ranks`, once each has written its done file for save `nonce`.

    Polls the store with backoff, one listing per round (no collective, so a slow rank never blocks
    the others' training).
    """
    entries: list[ManifestEntry] = []
    pending, delay = set(ranks), 0.02
    deadline = time.monotonic() + timeout
    while pending:
        # One listing per round, then a GET only for the done files that appeared.
        present = {info.key for info in folder.list("rank")}
        for rank in sorted(r for r in pending if done_file(r) in present):
            try:
                found, files = parse_done(folder.get(done_file(rank)))
            except NotFound:
                continue
            if found == nonce:  # an older save of the same name carries another nonce
                entries.extend(files)
                pending.discard(rank)
        if pending:
            if time.monotonic() > deadline:
                raise CheckpointError(f"{folder.url}: rank(s) {sorted(pending)} did not finish their upload "
                                      f"within {timeout:g}s; the checkpoint is left uncommitted", folder.url)
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)
    return entries


def commit(store: Store, manifest: CheckpointManifest) -> None:
    """Confirm every file of `manifest` is in the store, write the manifest, confirm it, then the pointer."""
    folder = store.child(manifest.name)
    check_sizes(store, manifest.name, manifest, {info.key: info.size for info in folder.list()})
    data = manifest.to_json()
    folder.put(MANIFEST, data)
    if folder.head(MANIFEST).size != len(data):
        raise CheckpointError(f"{folder.url_for(MANIFEST)}: written but not confirmed", folder.url)
    store.put(POINTER, manifest.name.encode())


def prune(store: Store, current: str, num_to_keep: int, keep_every_n: int | None) -> tuple[str, ...]:
    """Delete checkpoints older than `current` beyond the newest `num_to_keep` committed ones, except
    those whose batch is a multiple of `keep_every_n` and the pointer's target. Partial folders older
    than `current` go too (only one save is in flight, so nothing else is writing them). Folders newer
    than `current` (a timeline abandoned by resuming from an older checkpoint) are left alone.
    """
    folders = list_checkpoints(store)
    older = [n for n in newest_first(folders) if name_order(n) <= name_order(current)]
    committed = [n for n in older if MANIFEST in folders[n]]
    keep = set(committed[:num_to_keep]) | {current, read_pointer(store)}
    if keep_every_n:
        keep |= {n for n in committed if name_order(n)[0] % keep_every_n == 0}
    doomed = tuple(n for n in older if n not in keep)
    for name in doomed:
        # The manifest goes first: an interrupted delete leaves a partial folder, never a committed one
        # with files missing.
        store.delete(f"{name}/{MANIFEST}")
        store.delete_many(f"{name}/{key}" for key in folders[name] if key != MANIFEST)
    return doomed


def fetch(store: Store, name: str, needed: Callable[[CheckpointManifest], list[str]], local: Path,
          verify_rest: bool) -> CheckpointManifest:
    """Verify checkpoint `name` and download the files `needed(manifest)` names into `local`.

    Every file must be present with its manifest size; downloaded files must match their hash, and so
    must the rest when `verify_rest`. Raises CheckpointCorrupt naming the file and what is wrong.
    """
    url = store.url_for(name)
    folder = store.child(name)
    manifest = read_manifest(store, name)
    check_sizes(store, name, manifest, {info.key: info.size for info in folder.list()})
    entries = manifest.entries()
    keys = needed(manifest)
    missing = [k for k in keys if k not in entries]
    if missing:
        raise CheckpointCorrupt(f"{url}: {MANIFEST} does not list {', '.join(missing)}", url)
    try:
        for key in keys:
            entry = entries[key]
            download_from(folder, key, local / key, size=entry.size, hash=(HASH, entry.xxh64))
        for key in sorted(set(entries) - set(keys)) if verify_rest else ():
            digest = xxhash.xxh64(folder.get(key)).hexdigest()
            if digest != entries[key].xxh64:
                raise IntegrityError(f"{folder.url_for(key)}: {HASH} mismatch (expected "
                                     f"{entries[key].xxh64}, got {digest})", folder.url_for(key))
    except (IntegrityError, NotFound) as exc:
        raise CheckpointCorrupt(str(exc), url) from None
    return manifest
