"""File locks that a killed process cannot leave behind, and the cache folders they guard.

    with flocked(root / ".model.lock", fcntl.LOCK_EX):   # one process of a node works, the others wait
        ...
    folder = filled_once(cache / "llama-3-8b-1a2b", lambda partial: download_into(partial))

Every lock file of Tessera is an `flock` taken here (the node-local shard cache, the model, checkpoint
and fine-tuning caches, the packed index; the platform's supervisor lock is an flock too): the kernel
drops it with the process, so a process killed with `kill -9` while holding one leaves nothing that
makes the next one refuse or wait. The lock file itself stays behind and means nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def flocked(path: Path, mode: int) -> Iterator[int]:
    """Hold flock(mode) on `path` (created if needed) for the duration of the block; yields the fd."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def filled_once(target: Path, fill: Callable[[Path], object]) -> Path:
    """`target`, a folder `fill(partial)` makes once into a temporary folder beside it, renamed into place
    (atomic: a folder at `target` is always complete, so it is its own marker). The processes of a node
    share it: the first to take `.<name>.lock` fills, the others block on the lock (no polling) and find
    it made. What a process killed mid-fill left (its partial folder) is removed by the next filler."""
    if target.is_dir():
        return target
    root = target.parent
    with flocked(root / f".{target.name}.lock", fcntl.LOCK_EX):
        if target.is_dir():  # another process made it while this one waited
            return target
        for stale in root.glob(f".{target.name}.partial-*"):  # its filler died: we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=root))
        try:
            fill(partial)
            os.rename(partial, target)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return target
