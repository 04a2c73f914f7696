"""Folders of derived files under the node's temp dir (packed indexes, shared epoch plans), kept bounded.

Each folder is one key's (a dataset's index, a run plan) and is rebuilt whenever it is missing, so any
of them may go at any time: a process that mapped a file keeps its mapping after the file is removed.
Every use refreshes the folder's mtime (`touch`); `prune` then keeps the most recently used ones and
removes those their owner calls stale (a packed index whose index.json no longer exists), so a node that
opens dataset after dataset does not fill its temp dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def node_root(kind: str) -> Path:
    """The folder of one kind of derived files under this node's temp dir: `<tmp>/tessera-<kind>`."""
    return Path(tempfile.gettempdir()) / f"tessera-{kind}"


def touch(folder: Path) -> None:
    """Mark `folder` as just used (its mtime), best effort."""
    with contextlib.suppress(OSError):
        os.utime(folder)


def prune(root: Path, keep: int, stale: Callable[[Path], bool] = lambda _: False,
          spare: Path | None = None) -> list[Path]:
    """Remove the folders under `root` beyond the `keep` most recently used, and those `stale` calls
    stale, never `spare`; the folders removed. Best effort: one another process removes first, or that
    cannot be removed, is skipped."""
    try:
        folders = [(entry.stat().st_mtime, Path(entry.path)) for entry in os.scandir(root) if entry.is_dir()]
    except OSError:
        return []
    folders.sort(reverse=True)
    removed = []
    for rank, (_, folder) in enumerate(folders):
        if folder == spare or (rank < keep and not stale(folder)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
    return removed
