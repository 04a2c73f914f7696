"""A run does not inherit the control plane's own variables (database URL, secrets key, artifacts URL),
nor, on a server replica, its bucket credentials; everything else in the environment still reaches it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from platform_helpers import wait_for

from tessera.platform import Platform
from tessera.platform.clusters.environment import (
    WITHHELD_VARIABLES,
    inherited_environment,
    withhold_server_credentials,
)


def test_the_control_plane_variables_are_withheld_and_the_rest_passes():
    environ = {"TESSERA_DB_URL": "postgresql://u:pw@db/t", "TESSERA_SECRET_KEY": "k", "TESSERA_SECRET_KEY_FILE": "/k",
               "TESSERA_ARTIFACTS_URL": "s3://b/p", "AWS_SECRET_ACCESS_KEY": "s", "HOME": "/root", "PATH": "/bin"}
    assert inherited_environment(environ) == {"AWS_SECRET_ACCESS_KEY": "s", "HOME": "/root", "PATH": "/bin"}
    environ[WITHHELD_VARIABLES] = "AWS_SECRET_ACCESS_KEY, OTHER"
    assert inherited_environment(environ) == {"HOME": "/root", "PATH": "/bin"}


def test_a_server_replica_adds_its_bucket_credentials(monkeypatch):
    monkeypatch.setenv(WITHHELD_VARIABLES, "MINE")
    withhold_server_credentials()
    names = set(os.environ[WITHHELD_VARIABLES].split(","))
    assert names == {"MINE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}


def test_a_local_run_cannot_read_the_secrets_key_or_the_database_url(platform: Platform, tmp_path: Path,
                                                                      monkeypatch):
    # the supervisor (started by create_run) inherits these; the run it launches must not see them
    monkeypatch.setenv("TESSERA_SECRET_KEY_FILE", str(tmp_path / "secret.key"))
    monkeypatch.setenv("TESSERA_DB_URL", "postgresql://user:hunter2@db.example/t")
    monkeypatch.setenv(WITHHELD_VARIABLES, "BUCKET_KEY")
    monkeypatch.setenv("BUCKET_KEY", "bucket-secret")
    monkeypatch.setenv("VISIBLE_TO_RUNS", "yes")
    probe = ("import os; print(sorted(k for k in os.environ if k.startswith(('TESSERA_DB', 'TESSERA_SECRET', "
             "'TESSERA_WITHHELD', 'BUCKET_')))); print(os.environ.get('VISIBLE_TO_RUNS'))")
    run = platform.create_run({"name": "env-probe", "command": f"{sys.executable} -c \"{probe}\""})
    wait_for(lambda: platform.get_run(run.name).status in ("COMPLETED", "FAILED"), timeout=90, what="the run ends")
    assert platform.get_run(run.name).status == "COMPLETED"
    lines = [line for line in platform.follow_logs(run.name, follow=False) if line.strip()]
    assert [line.rstrip("\n").split("] ")[-1] for line in lines[-2:]] == ["[]", "yes"]
