"""A run's local folder, `<home>/runs/NAME/` (spec.yaml, parameters.yaml, then a folder per resumption),
and its copy in the artifacts store, which every replica reads (artifacts.py).

Its name is the run's, so only the run whose row holds the name may write it: these are called inside the
state database's transactions that claim, edit and free the name (StateDB.insert_run, edit_spec,
delete_run), under its write lock, never before the database has decided. The artifacts are keyed by the
run's id, which no other run ever has.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tessera.platform.home import write_private
from tessera.platform.runs.artifacts import SPEC_FILE, ArtifactStore, run_files
from tessera.platform.spec.run_spec import RunSpec

OTHER_REPLICAS = ".replicated"   # runs/<this>/<run id>: runs another replica took the submission of


def write_run_folder(folder: Path, spec: RunSpec) -> None:
    """The folder of a run whose name was just claimed. A folder of that name left by a deleted run, or
    by a claim that was rolled back (a server killed mid-submit), is cleared first. Its copy in the
    artifacts store is made by whoever first launches the run (supervision/submission.py), from the
    spec the store holds: a submission makes no write outside the database's transaction that is
    flushed to disk, so it costs one commit."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, data in run_files(spec).items():
        (folder / name).write_bytes(data)


def write_spec(folder: Path, spec: RunSpec, artifacts: ArtifactStore, run_id: str) -> None:
    """Replace a run's spec.yaml whole (an edited spec): a reader never sees half of it."""
    if folder.is_dir():
        write_private(folder / SPEC_FILE, spec.to_yaml().encode())
    artifacts.put_spec(run_id, spec)


def move_away(folder: Path, trash: Path) -> None:
    """Move a deleted run's folder out of its name's way, to be removed after the delete commits."""
    if folder.exists():
        folder.rename(trash)


def local_run_folder(home: Path, run_folder: str, run_id: str) -> Path:
    """Where this host keeps a run's files (what its processes write, its parameters): the run's own folder
    when this home took the submission (a single machine always did), else one named by the run's id
    under this home, as a name is free for another run once its run is deleted."""
    folder = Path(run_folder)
    if folder.parent == home / "runs":
        return folder
    return home / "runs" / OTHER_REPLICAS / run_id
