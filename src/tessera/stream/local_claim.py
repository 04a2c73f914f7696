"""One cache folder serves one remote at a time: a dataset is refused a `local` folder that a live dataset
fills from another remote (MosaicML's "Reused local directory" ValueError).

Two such datasets would overwrite each other's index.json and take each other's equally named shards for
stale (the stamps differ), downloading them again and again. The claim is two files in the folder's state
folder (storage/state_folder.py): `remote` names what the folder caches, and every dataset using it holds a
shared `flock` on `in-use.lock` for as long as it lives. Another remote may take the folder over only when
no process holds that lock, so a folder left by a finished or killed run is reused freely (the kernel drops
a dead process's locks).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any

from tessera.storage.local import write_atomic
from tessera.storage.locks import flocked
from tessera.storage.state_folder import state_folder


class LocalInUse(ValueError):
    """The `local` folder is in use by a dataset of another remote."""


class LocalClaim:
    """This process's share of a cache folder for `remote` (a URL naming it), held until garbage."""

    def __init__(self, local: Path, remote: str) -> None:
        state = state_folder(local)
        state.mkdir(parents=True, exist_ok=True)
        self.fd: int | None = None
        with flocked(state / "claim.lock", fcntl.LOCK_EX):  # one claimer at a time: check, record, hold
            fd = os.open(state / "in-use.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                recorded = _read(state / "remote")
                if recorded not in (None, remote):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        raise LocalInUse(f"Reused local directory: {local} is in use by a dataset of {recorded}, vs "
                                         f"{remote} now. Provide a different one (or no local: Tessera then "
                                         "picks a folder named by the remote)") from None
                if recorded != remote:
                    write_atomic(state / "remote", remote.encode())
                fcntl.flock(fd, fcntl.LOCK_SH)
            except BaseException:
                os.close(fd)
                raise
        self.fd = fd

    def __getstate__(self) -> dict[str, Any]:
        """A DataLoader worker needs no claim of its own: the process that built the dataset holds it."""
        return {"fd": None}

    def __del__(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
