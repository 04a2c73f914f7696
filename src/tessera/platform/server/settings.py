"""Where the server keeps its state and what it listens on, resolved once at start."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from tessera.platform.home import private_dir, tessera_home
from tessera.platform.runs.artifacts import artifacts_url
from tessera.platform.store.leases import DEFAULT_LEASE_SECONDS
from tessera.storage.url import parse_url

ENV_DB_URL = "TESSERA_DB_URL"
MiB = 1024 * 1024


class ServerSettings(BaseModel):
    """`home` holds server.db (by default), secret.key and teams/<team>/ (each a platform home)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    home: Path
    db_url: str
    max_body_bytes: int = Field(MiB, ge=1)
    lease_seconds: float = Field(DEFAULT_LEASE_SECONDS, gt=0, le=3600)   # how long a run's lease lasts unrenewed
    artifacts_url: str   # run files, logs and metrics of every team (runs/artifacts.py), shared by the replicas

    @classmethod
    def resolve(cls, *, host: str = "127.0.0.1", port: int = 8080, home: str | Path | None = None,
                db_url: str | None = None, max_body_bytes: int = MiB,
                lease_seconds: float = DEFAULT_LEASE_SECONDS, artifacts: str | None = None) -> ServerSettings:
        """Defaults: home `$TESSERA_HOME/server`, database `$TESSERA_DB_URL` or SQLite in the home,
        artifacts `$TESSERA_ARTIFACTS_URL` or the home's folder `artifacts`."""
        folder = private_dir(Path(home).expanduser().resolve()) if home else private_dir(tessera_home() / "server")
        url = db_url or os.environ.get(ENV_DB_URL) or f"sqlite:///{folder / 'server.db'}"
        # --artifacts, else $TESSERA_ARTIFACTS_URL, else <home>/artifacts; a malformed URL: one line naming it
        shared = parse_url(artifacts_url(folder, artifacts)).root_url()
        return cls(host=host, port=port, home=folder, db_url=url, max_body_bytes=max_body_bytes,
                   lease_seconds=lease_seconds, artifacts_url=shared)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
