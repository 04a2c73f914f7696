"""Retention: which checkpoints a run keeps, and deleting the others completely.

The choice (`checkpoints_to_delete`) is a pure function of the folder names, which of them are
committed, and the pointer, so it can be tested without a store. Deleting (`delete_checkpoint`) removes
the manifest first, so an interrupted delete leaves a partial folder (skipped on load), never a
committed one with files missing; then every other key, then, in a local folder, the directory itself:
a local store keeps empty directories that an object store would not, and a run that keeps three
checkpoints must not leave dozens of empty `ep*-ba*` folders beside them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping

from tessera.storage import Store
from tessera.train.checkpoint.layout import MANIFEST, list_checkpoints, name_order, newest_first, read_pointer


def checkpoints_to_delete(folders: Mapping[str, Iterable[str]], current: str, pointer: str | None,
                          num_to_keep: int, keep_every_n: int | None) -> tuple[str, ...]:
    """The checkpoint folders to delete once `current` is committed, newest first.

    `folders` maps each checkpoint name to the keys in its folder. Kept: the newest `num_to_keep`
    committed checkpoints not newer than `current`, those whose batch is a multiple of `keep_every_n`,
    `current` and the pointer's target. Partial folders older than `current` go too (only one save is
    in flight, so nothing else is writing them). Folders newer than `current` (a timeline abandoned by
    resuming from an older checkpoint) are left alone.
    """
    current_order = name_order(current)
    older = [n for n in newest_first(folders) if current_order is not None and name_order(n) <= current_order]
    committed = [n for n in older if MANIFEST in set(folders[n])]
    keep = set(committed[:num_to_keep]) | {current, pointer}
    if keep_every_n:
        keep |= {n for n in committed if name_order(n)[0] % keep_every_n == 0}
    return tuple(n for n in older if n not in keep)


def delete_checkpoint(store: Store, name: str, keys: Iterable[str]) -> None:
    """Delete checkpoint `name`, whose folder holds `keys`: the manifest first, then the rest, then
    (in a local folder) the directory, with anything a listing does not show (temporary files)."""
    keys = list(keys)
    store.delete(f"{name}/{MANIFEST}")
    store.delete_many(f"{name}/{key}" for key in keys if key != MANIFEST)
    folder = store.local_path(name)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def prune(store: Store, current: str, num_to_keep: int, keep_every_n: int | None) -> tuple[str, ...]:
    """Apply retention to the checkpoints in `store` after `current` was committed; the names deleted."""
    folders = list_checkpoints(store)
    doomed = checkpoints_to_delete(folders, current, read_pointer(store), num_to_keep, keep_every_n)
    for name in doomed:
        delete_checkpoint(store, name, folders[name])
    return doomed
