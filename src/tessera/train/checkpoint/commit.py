"""The commit protocol of a save, and the verified fetch of a load, over any `Store`.

Save: every rank uploads its staged files (`upload_folder`) and, on ranks other than 0, a done file
listing them. Rank 0 waits for those done files (`wait_for_ranks`, polling the store: no collective,
so a slow rank never blocks the others' training), then `commit`s: it confirms every file with one
listing, writes `manifest.json`, confirms it, and only then moves the `latest` pointer. A save killed
anywhere before the pointer moves leaves the previous checkpoint as the one to resume from.

Load: `fetch` trusts nothing but the manifest: every file must be listed with its size, and every file
read must match its hash. No torch and no threads of our own here (uploads run on the caller's thread,
or a short-lived pool of `threads`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

from tessera.progress import WorkProgress
from tessera.storage import IntegrityError, NotFound, Store, download_from
from tessera.storage.transfer import hash_file
from tessera.train.checkpoint.layout import (
    HASH,
    MANIFEST,
    POINTER,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointManifest,
    ManifestEntry,
    check_sizes,
    done_file,
    parse_done,
    read_manifest,
)


def upload_folder(folder: Store, local: Path, threads: int = 1,
                  initializer: Callable[[], None] | None = None) -> list[ManifestEntry]:
    """Upload every file under `local` to `folder` (same relative keys); their sizes and hashes.

    `threads` bounds the concurrency (throttle.default_upload_threads); `initializer` runs in each
    upload thread first (the writer's lower priority)."""
    paths = sorted(p for p in local.rglob("*") if p.is_file())

    def one(path: Path) -> ManifestEntry:
        key = path.relative_to(local).as_posix()
        entry = ManifestEntry(key, path.stat().st_size, hash_file(path, HASH))
        folder.put_file(key, path)
        return entry

    if threads <= 1 or len(paths) <= 1:  # no pool: the save thread uploads, at its own priority
        return [one(path) for path in paths]
    with ThreadPoolExecutor(max_workers=threads, initializer=initializer) as pool:
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


def fetch(store: Store, name: str, needed: Callable[[CheckpointManifest], list[str]], local: Path,
          verify_rest: bool, show_progress: bool = False) -> CheckpointManifest:
    """Verify checkpoint `name` and download the files `needed(manifest)` names into `local`.

    Every file must be present with its manifest size; downloaded files must match their hash, and so
    must the rest when `verify_rest`. Raises CheckpointCorrupt naming the file and what is wrong.
    `show_progress`: the download's bytes on stderr (tessera.progress), from one rank of a run.
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
    total = sum(entries[key].size for key in keys)
    try:
        with WorkProgress(f"loading checkpoint {name}", unit="bytes", total=total,
                          enabled=show_progress) as progress:
            for key in keys:
                entry = entries[key]
                download_from(folder, key, local / key, size=entry.size, hash=(HASH, entry.xxh64),
                              progress=progress.advance)
        for key in sorted(set(entries) - set(keys)) if verify_rest else ():
            digest = xxhash.xxh64(folder.get(key)).hexdigest()
            if digest != entries[key].xxh64:
                raise IntegrityError(f"{folder.url_for(key)}: {HASH} mismatch (expected "
                                     f"{entries[key].xxh64}, got {digest})", folder.url_for(key))
    except (IntegrityError, NotFound) as exc:
        raise CheckpointCorrupt(str(exc), url) from None
    return manifest
