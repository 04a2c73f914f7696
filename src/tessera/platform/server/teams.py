"""Each team's platform: `Platform(<server home>/teams/<team>)`, so isolation holds by construction (a
run of another team is not in the home at all).

A Platform holds one SQLite connection, which must not carry two threads' transactions at once, while
the API serves requests from a pool of threads: so each request opens the team's Platform and closes it
when done (a connection and a few stat calls; the secret key is read only when a secret is used).
"""

from __future__ import annotations

import os
from pathlib import Path

from tessera.platform.api.sdk import Platform
from tessera.platform.home import private_dir
from tessera.platform.spec.run_spec import validate_name
from tessera.platform.store.state import ACTIVE, StateDB
from tessera.platform.supervision.supervisor import ensure_supervisor

ENV_SECRET_KEY = "TESSERA_SECRET_KEY"
ENV_SECRET_KEY_FILE = "TESSERA_SECRET_KEY_FILE"


def use_server_secret_key(server_home: Path) -> None:
    """Every team's secrets are encrypted with the server's key file (0600, made on first use), unless
    the operator gave a key: set in this process's environment so the team supervisors it spawns, which
    inject the secrets into runs, read the same key."""
    if not os.environ.get(ENV_SECRET_KEY) and not os.environ.get(ENV_SECRET_KEY_FILE):
        os.environ[ENV_SECRET_KEY_FILE] = str(server_home / "secret.key")


class TeamPlatforms:
    def __init__(self, server_home: Path) -> None:
        self.root = private_dir(server_home / "teams")

    def home(self, team: str) -> Path:
        return self.root / validate_name(team, "team name")

    def open(self, team: str) -> Platform:
        """The team's Platform (its home is created on first use); the caller closes it."""
        return Platform(self.home(team))

    def has_run(self, team: str, run_id: str) -> bool:
        """Whether the team has the run of that id (what decides a submit's audit entry, audit.py)."""
        home = self.home(team)
        if not (home / "state.db").exists():
            return False
        with StateDB(home) as db:
            record = db.get_run(run_id)
        return record is not None and record.id == run_id

    def resume_supervisors(self) -> list[str]:
        """Start the supervisor of every team with active runs (after a reboot nothing else would, until
        someone acted on a run); returns those teams."""
        teams = []
        for home in sorted(p for p in self.root.iterdir() if (p / "state.db").exists()):
            platform = Platform(home)
            try:
                if platform.count_runs(ACTIVE):
                    ensure_supervisor(home)
                    teams.append(home.name)
            finally:
                platform.close()
        return teams
