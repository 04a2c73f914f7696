"""A remote stream's index.json, fetched once per node and kept in its cache folder.

Every start checks the remote's index.json afresh (a dataset may have been rewritten), but downloading it
in every rank of a node (183 MB for 500k shards) is what MosaicML does and what the packed index exists
to avoid. So the download is stamped: `<state folder>/index.source` records which remote object (size,
etag, last modified) the cached index.json came from, and the cached file's own stat. A process asks the
remote for the object's metadata (one HEAD) and uses the cached copy when the stamp names that object
and that file; otherwise it takes the node's index lock, looks again (another rank may have fetched it
meanwhile) and downloads. So the first rank of a node downloads, the others wait on the lock, find it
fetched and map the packed index that rank made; a later start with an unchanged remote downloads nothing.

The download goes to a file (never into memory), and replaces the cached index.json only when its bytes
differ, so the packed form (keyed by the file's stat) stays valid. When the remote cannot be read, an
index.json cached by an earlier start is used, with a warning (MosaicML always uses a cached one).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import warnings
from pathlib import Path
from typing import Any

from tessera.shards.errors import DatasetNotFound
from tessera.shards.index import INDEX_BASENAME
from tessera.storage import NotFound, StorageError, Store, download_from
from tessera.storage.local import LocalStore, write_atomic
from tessera.storage.locks import flocked
from tessera.storage.state_folder import state_folder
from tessera.stream.forksafe import call_outside_runtime

SOURCE = "index.source"  # in the cache's state folder: the remote object the cached index.json came from


def _outside(remote: Store, fn: Any) -> Any:
    """`fn()` so that DataLoader workers can still fork() afterwards: an object store is read from a
    fork()ed helper while obstore's runtime has not started here (forksafe.py); a local folder directly."""
    return fn() if isinstance(remote, LocalStore) else call_outside_runtime(fn)


def _source(remote: Store) -> list[Any] | None:
    """What names the remote's index.json as it is now (None when the store tells too little to know)."""
    info = _outside(remote, lambda: remote.head(INDEX_BASENAME))
    if info.etag is None and info.last_modified is None:
        return None
    return [info.size, info.etag, info.last_modified.isoformat() if info.last_modified else None]


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _fetched(stamp: Path, source: list[Any] | None, cached: Path) -> bool:
    """Whether `cached` is the remote object `source` names, as downloaded by a process of this node."""
    if source is None:
        return False
    try:
        return json.loads(stamp.read_bytes()) == [source, _stat(cached)]
    except (OSError, ValueError):
        return False


def _same_files(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes (read in chunks)."""
    with contextlib.suppress(OSError), open(a, "rb") as fa, open(b, "rb") as fb:
        if os.fstat(fa.fileno()).st_size != os.fstat(fb.fileno()).st_size:
            return False
        while chunk := fa.read(1 << 20):
            if chunk != fb.read(len(chunk)):
                return False
        return True
    return False


def fetch_index(remote: Store, local_root: Path, label: str) -> None:
    """index.json from the remote into `local_root`, once per node (see the module docstring)."""
    cached = local_root / INDEX_BASENAME
    state = state_folder(local_root)
    stamp = state / SOURCE
    try:
        source = _source(remote)
        if _fetched(stamp, source, cached):
            return
        with flocked(state / "index.lock", fcntl.LOCK_EX):
            if _fetched(stamp, source, cached):  # fetched by another process of the node meanwhile
                return
            fresh = state / "index.download"
            _outside(remote, lambda: download_from(remote, INDEX_BASENAME, fresh))
            if _same_files(cached, fresh):
                fresh.unlink()
            else:
                local_root.mkdir(parents=True, exist_ok=True)
                os.replace(fresh, cached)
            write_atomic(stamp, json.dumps([source, _stat(cached)]).encode())
    except StorageError as err:
        if not cached.is_file():
            if isinstance(err, NotFound):
                raise DatasetNotFound(f"{label}: no index.json; is the remote URL right, and was the dataset "
                                      "written completely?") from None
            raise
        warnings.warn(f"{label}: {type(err).__name__}: {err}; using the index.json cached at {cached}",
                      stacklevel=4)
