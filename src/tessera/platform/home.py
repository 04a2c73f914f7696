"""Where the platform keeps its state: `$TESSERA_HOME`, default `~/.tessera` (folder mode 0700)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

ENV_HOME = "TESSERA_HOME"


def tessera_home(home: str | Path | None = None) -> Path:
    """The home folder (created 0700 if missing): `home`, else $TESSERA_HOME, else ~/.tessera."""
    path = Path(home or os.environ.get(ENV_HOME) or "~/.tessera").expanduser().resolve()
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)   # another thread may make it at once
        path.chmod(0o700)
    return path


def private_dir(path: Path) -> Path:
    """A folder only the owner can enter (0700), created if missing."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


def write_private(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Write a file atomically with mode 0600 from the first byte on (never world-readable, even briefly).
    The temporary file's name is unique to this call (threads of one server write the same path at once);
    `exclusive` publishes it only where no file is (FileExistsError otherwise: the file system decides
    between racing creators), instead of replacing one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not exclusive:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
