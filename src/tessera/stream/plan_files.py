"""Epoch plans built once per node and mapped by every rank and DataLoader worker (issue 24).

An epoch plan holds a few arrays per lane (batching/epoch_plan.py: the lane's units in order and their
first positions, O(units of the lane)). Built in each process, that is one copy per rank and per spawned
or forkserver worker, and each pays the build (the run's unit permutation, O(units)). `PlanFiles` is the
`PlanStore` that makes the first process of the node write what it built to a file, atomically, under
an flock (the node's other processes wait for it), and every process map that file read-only: their
pages are shared, a worker maps the lanes it reads and builds nothing (storage/array_file.py: the format).

Files live in `<tmp>/tessera-plans/<plan fingerprint>/` (the fingerprint names everything a plan is made
from: the dataset's index, weights, seed, lanes, block size). A file is used only if it is whole (its
checksum); a damaged or half-written one is built again. Only this epoch's and the previous
epoch's files are kept per plan, and the most recently used plans (`KEEP_PLANS`) under the temp dir
(storage/temp_folders.py). When the temp dir cannot be written the plan stays in the process's memory.
"""

from __future__ import annotations

import fcntl
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tessera.storage.array_file import load, save
from tessera.storage.locks import flocked
from tessera.storage.temp_folders import node_root, prune, touch

MAGIC = b"TSPLAN01"
KEEP_PLANS = 16
_EPOCH = re.compile(r"^e(\d+)\.")


class PlanFiles:
    """The `PlanStore` of one run plan on this node (see the module docstring)."""

    def __init__(self, fingerprint: str, root: Path | None = None) -> None:
        self.root = root or node_root("plans")
        self.folder = self.root / fingerprint

    def get_or_build(self, name: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        found = load(self.folder / name, MAGIC)
        if found is not None:
            touch(self.folder)
            return found
        try:
            with flocked(self.folder / ".lock", fcntl.LOCK_EX):
                found = load(self.folder / name, MAGIC)  # built by another process meanwhile
                if found is None:
                    arrays = build()
                    save(self.folder / name, arrays, MAGIC)
                    del arrays
                    found = load(self.folder / name, MAGIC)
                    self._forget_old(name)
        except OSError:  # a temp dir that cannot be written: this process keeps its own
            found = None
        return found if found is not None else build()

    def _forget_old(self, name: str) -> None:
        """Files of epochs before the previous one, and plans beyond the most recently used."""
        now = _EPOCH.match(name)
        for path in self.folder.iterdir() if now else ():
            then = _EPOCH.match(path.name)
            if then and int(then.group(1)) < int(now.group(1)) - 1:
                path.unlink(missing_ok=True)
        prune(self.root, KEEP_PLANS, spare=self.folder)
