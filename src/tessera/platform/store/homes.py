"""Where each kind of platform keeps its store: the standalone CLI in `$TESSERA_HOME/store.db` (SQLite, one
team named "local"), a server in its `--db` (each team's platform a view of the same engine).

The first use of a home in a process imports what an older version left there (legacy.py): its
`state.db`, once. A server does the same for the team folders of its home (`teams/<team>/state.db`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sqlalchemy import Engine

from tessera.platform.home import tessera_home
from tessera.platform.store.db import shared_engine, sqlite_url
from tessera.platform.store.legacy import STATE_FILE, import_state_db

LOCAL_TEAM = "local"
STORE_FILE = "store.db"
_ready: set[Path] = set()
_lock = threading.Lock()


def home_engine(home: str | Path | None = None) -> Engine:
    """The engine of the standalone home's store (made 0600 before SQLite first opens it), with an older
    version's state imported."""
    folder = tessera_home(home)
    path = folder / STORE_FILE
    if not path.exists():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:   # another process made it first
            pass
    engine = shared_engine(sqlite_url(path))
    with _lock:
        if folder not in _ready:
            import_home(engine, folder, LOCAL_TEAM)
            _ready.add(folder)
    return engine


def import_home(engine: Engine, home: Path, team: str) -> int | None:
    """Import `home/state.db` into `team` if an older version left one there (None: none, or done)."""
    old = home / STATE_FILE
    return import_state_db(engine, old, team) if old.is_file() else None


def import_server_home(engine: Engine, server_home: Path) -> dict[str, int]:
    """Import every team folder of an older server's home (`teams/<team>/state.db`); team -> runs brought."""
    teams = server_home / "teams"
    done: dict[str, int] = {}
    for folder in sorted(teams.iterdir()) if teams.is_dir() else []:
        count = import_home(engine, folder, folder.name) if folder.is_dir() else None
        if count is not None:
            done[folder.name] = count
    return done
