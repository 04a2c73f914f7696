"""Each team's platform: the team's view of the server's one store (`Platform(engine=E, team=T)`), so
isolation holds by construction: every query of a team's platform is scoped to its team.

A Platform holds no connection (each call takes one from the engine's pool), so each request makes its
team's Platform. `<server home>/teams/<team>` is where this replica keeps the team's run folders and
runs' working directories; nothing another replica needs is kept there. A server home made by an older
version (a state.db and secret files per team folder) is imported into the store at start
(`import_old_homes`), and by `tessera server migrate`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from tessera.platform.api.sdk import Platform
from tessera.platform.home import private_dir
from tessera.platform.runs.artifacts import ArtifactStore, open_root
from tessera.platform.secrets.crypto import ENV_SECRET_KEY, ENV_SECRET_KEY_FILE
from tessera.platform.spec.run_spec import validate_name
from tessera.platform.store.homes import import_server_home


def use_server_secret_key(server_home: Path) -> None:
    """Every team's secrets are encrypted with the server's key file (0600, made on first use), unless
    the operator gave a key (each replica must be given the same one: the store refuses another)."""
    if not os.environ.get(ENV_SECRET_KEY) and not os.environ.get(ENV_SECRET_KEY_FILE):
        os.environ[ENV_SECRET_KEY_FILE] = str(server_home / "secret.key")


class TeamPlatforms:
    def __init__(self, engine: Engine, server_home: Path, wake: Callable[[], object] | None = None, *,
                 artifacts_url: str) -> None:
        self.engine = engine
        self.artifacts = open_root(artifacts_url)   # every team's runs' files, under the team's key
        self.server_home = server_home
        self.root = private_dir(server_home / "teams")
        self.wake = wake

    def home(self, team: str) -> Path:
        return self.root / validate_name(team, "team name")

    def open(self, team: str) -> Platform:
        """The team's Platform (its folder on this replica is made on first use)."""
        return Platform(self.home(team), engine=self.engine, team=team, supervise=self.wake or (lambda: None),
                        artifacts=ArtifactStore(self.artifacts, team))

    def import_old_homes(self) -> dict[str, int]:
        """Import the runs and secrets an older version kept per team folder; team -> runs imported."""
        imported = import_server_home(self.engine, self.server_home)
        for folder in sorted(self.root.iterdir()):
            if (folder / "secrets").is_dir():
                self.open(folder.name).secrets.list()   # the first use imports the team's secret files
        return imported
