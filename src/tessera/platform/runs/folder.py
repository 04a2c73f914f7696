"""A run's folder, `<home>/runs/NAME/` (spec.yaml, parameters.yaml, then a folder per resumption).

Its name is the run's, so only the run whose row holds the name may write it: these are called inside the
state database's transactions that claim, edit and free the name (StateDB.insert_run, edit_spec,
delete_run), under its write lock, never before the database has decided.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tessera.platform.home import write_private
from tessera.platform.spec.run_spec import RunSpec


def write_run_folder(folder: Path, spec: RunSpec) -> None:
    """The folder of a run whose name was just claimed. A folder of that name left by a deleted run,
    or by a claim that was rolled back (a server killed mid-submit), is cleared first."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "spec.yaml").write_text(spec.to_yaml(), encoding="utf-8")
    (folder / "parameters.yaml").write_text(yaml.safe_dump(spec.parameters, sort_keys=False), encoding="utf-8")


def write_spec(folder: Path, spec: RunSpec) -> None:
    """Replace a run's spec.yaml whole (an edited spec): a reader never sees half of it."""
    write_private(folder / "spec.yaml", spec.to_yaml().encode())


def move_away(folder: Path, trash: Path) -> None:
    """Move a deleted run's folder out of its name's way, to be removed after the delete commits."""
    if folder.exists():
        folder.rename(trash)
