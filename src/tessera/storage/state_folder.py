"""Where Tessera keeps its own files about a folder of data: beside the folder, not inside it.

    state_folder(Path("/data/cache"))   # -> /data/.cache.tessera (made by whoever writes there first)

A stream's cache folder (MosaicML's `local`) holds exactly what its remote holds, index.json and the
shard files, as MosaicML's does: code that lists it, compares it with the remote, or copies it as a
dataset sees only the dataset. Tessera's download locks, pins, stamps, journal and packed index live in
a hidden sibling instead, on the same file system (so `flock` and atomic renames behave as in the folder)
and under the same parent (so it goes where the cache goes). Stamps name the index entry a shard file
was downloaded for and count only next to that file: a sibling that outlives a deleted cache folder
leaves nothing that could be taken for data.

Two cases keep the state inside the folder, as `.tessera/`: a folder that already has one (written by
an earlier Tessera: processes of both versions sharing the cache keep coordinating, and nothing cached is
fetched again; delete it to move the state out), and a folder whose parent cannot be written (a mount
point).
"""

from __future__ import annotations

import os
from pathlib import Path

INSIDE = ".tessera"
SUFFIX = ".tessera"


def state_folder(folder: str | os.PathLike[str]) -> Path:
    """Tessera's state folder for the data folder `folder` (neither needs to exist yet; every process,
    before or after either is created, chooses the same place)."""
    folder = Path(folder).absolute()
    inside = folder / INSIDE
    if folder.parent == folder or inside.is_dir() or not _can_create_in(folder.parent):
        return inside
    return folder.parent / f".{folder.name}{SUFFIX}"


def is_state_folder(name: str) -> bool:
    """Whether a folder of this name is a state folder (a walk over data skips it): a data folder
    nested in another one has its state folder in that one."""
    return name == INSIDE or (name.startswith(".") and name.endswith(SUFFIX))


def _can_create_in(path: Path) -> bool:
    """Whether this process can create entries in `path`: a folder not made yet would be made by it
    under its closest existing ancestor, so that one decides."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return os.access(path, os.W_OK)
