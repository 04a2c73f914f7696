"""Where every replica finds what a run leaves: its spec, parameters, logs and metrics, under one storage URL
(`tessera server start --artifacts URL`, `TESSERA_ARTIFACTS_URL`; a folder or s3://bucket/prefix, through
tessera.storage, one code path for both). Without one, a folder inside the home, so a single machine
works as it did.

    <team>/runs/<run_id>/spec.yaml                       written at its first launch (and on an edit), whole
    <team>/runs/<run_id>/parameters.yaml                 written at its first launch
    <team>/runs/<run_id>/logs/r<resumption>/node-<rank>/<seq>.chunk     each node's log (chunks.py)
    <team>/runs/<run_id>/metrics/<seq>.chunk             what the run reports to TESSERA_METRICS

Keys are by run id, not name: a name is free again once its run is deleted, an id never. The processes
of a run write to a private local folder on the host that runs them; whoever supervises the run ships the
new bytes here (shipping.py) and every reader (`run logs`, following, metrics) reads from here, so any
replica serves a run's output while it runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from tessera.platform.home import write_private
from tessera.platform.runs.chunks import Chain
from tessera.platform.spec.run_spec import RunSpec, validate_name
from tessera.storage import Store, open_store

ENV_ARTIFACTS_URL = "TESSERA_ARTIFACTS_URL"
HOME_FOLDER = "artifacts"     # the root inside a home when no URL is given
SPEC_FILE = "spec.yaml"
PARAMETERS_FILE = "parameters.yaml"


def artifacts_url(home: Path, url: str | None = None) -> str:
    """`url`, else $TESSERA_ARTIFACTS_URL, else the folder `artifacts` inside `home`."""
    return url or os.environ.get(ENV_ARTIFACTS_URL) or str(home / HOME_FOLDER)


def open_root(url: str) -> Store:
    """The artifacts root of a server, checked at start by one LIST: a missing bucket or refused
    credentials stop the server with one line naming the URL, not the first run that ships a log."""
    store = open_store(url)
    next(iter(store.list("", start_after="")), None)
    return store


def run_files(spec: RunSpec) -> dict[str, bytes]:
    """A run's files, by name: what its folder, its artifacts and the host that launches it hold."""
    return {SPEC_FILE: spec.to_yaml().encode(), PARAMETERS_FILE: spec.parameters_yaml().encode()}


def _index(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {value!r}")
    return value


class ArtifactStore:
    """One team's runs under a storage root; every key it makes is checked (no path tricks in a team,
    run id, resumption or rank reaches the store)."""

    def __init__(self, store: Store, team: str) -> None:
        self.store = store
        self.team = validate_name(team, "team name")

    @classmethod
    def open(cls, url: str, team: str) -> ArtifactStore:
        return cls(open_store(url), team)

    def run_prefix(self, run_id: str) -> str:
        return f"{self.team}/runs/{validate_name(run_id, 'run id')}/"

    # --- run files --------------------------------------------------------------------------------

    def put_run_files(self, run_id: str, spec: RunSpec) -> None:
        """The spec and parameters of a run about to be launched the first time (each put is atomic: whole or
        absent)."""
        prefix = self.run_prefix(run_id)
        for name, data in run_files(spec).items():
            self.store.put(prefix + name, data)

    def put_spec(self, run_id: str, spec: RunSpec) -> None:
        """An edited spec, replacing the old one whole."""
        self.store.put(self.run_prefix(run_id) + SPEC_FILE, spec.to_yaml().encode())

    def place_run_files(self, run_id: str, spec: RunSpec, folder: Path) -> None:
        """Make spec.yaml and parameters.yaml exist in a run's local folder on the host that launches it
        (its processes read TESSERA_PARAMETERS there), from the spec the store holds: a host that did not
        take the submission has no copy."""
        for name, data in run_files(spec).items():
            if not (folder / name).exists():
                folder.mkdir(parents=True, exist_ok=True)
                write_private(folder / name, data)

    def delete_run(self, run_id: str) -> None:
        """Everything a deleted run left."""
        prefix = self.run_prefix(run_id)
        self.store.delete_many([info.key for info in self.store.list(prefix)])

    # --- chains -----------------------------------------------------------------------------------

    def log_chain(self, run_id: str, resumption: int, node: int) -> Chain:
        return Chain(self.store, f"{self.run_prefix(run_id)}logs/r{_index(resumption, 'resumption')}/"
                                 f"node-{_index(node, 'node rank')}/")

    def metrics_chain(self, run_id: str) -> Chain:
        return Chain(self.store, f"{self.run_prefix(run_id)}metrics/")
