"""The environment a run inherits from the process that launches it.

A local run is a child of the supervisor, and `sbatch` hands the submitting environment to the job, so
without care a run would read whatever configures the control plane itself: the database URL (with its
password), the secrets key that decrypts every team's secrets, the artifacts URL. A run never needs them
(its secrets arrive decrypted, one by one, through the spec), and on a team server a run is somebody's
code, so they are withheld. A server replica withholds more names (its own bucket credentials) by listing
them in TESSERA_WITHHELD_VARIABLES, which is itself withheld.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

WITHHELD_VARIABLES = "TESSERA_WITHHELD_VARIABLES"
CONTROL_PLANE_VARIABLES = frozenset({
    "TESSERA_DB_URL", "TESSERA_SECRET_KEY", "TESSERA_SECRET_KEY_FILE", "TESSERA_ARTIFACTS_URL",
    WITHHELD_VARIABLES,
})
# What a server replica adds to the list at start: the credentials it reaches its artifacts bucket with.
SERVER_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def withheld(environ: Mapping[str, str]) -> frozenset[str]:
    """The names a run does not inherit from `environ`."""
    extra = {name.strip() for name in environ.get(WITHHELD_VARIABLES, "").split(",") if name.strip()}
    return CONTROL_PLANE_VARIABLES | extra


def inherited_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) without the control plane's own variables."""
    environ = os.environ if environ is None else environ
    hidden = withheld(environ)
    return {key: value for key, value in environ.items() if key not in hidden}


def withhold_server_credentials() -> None:
    """Called once by a server replica at start: its bucket credentials stay out of the runs it launches
    (a team's run reaches buckets through the team's secrets)."""
    names = set(withheld(os.environ) - CONTROL_PLANE_VARIABLES) | set(SERVER_CREDENTIALS)
    os.environ[WITHHELD_VARIABLES] = ",".join(sorted(names))
