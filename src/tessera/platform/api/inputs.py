"""What SDK callers pass, turned into what the platform works with: a spec from a path, YAML text or
a dict; run statuses checked and upper-cased; the submitting user. Shared by the local SDK (sdk.py) and
anything else that takes the same arguments (the server's remote client), so both accept the same input.
"""

from __future__ import annotations

import getpass
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tessera.platform.clusters import LOCAL
from tessera.platform.spec.run_spec import RunSpec, load_spec, parse_spec, validate_spec
from tessera.platform.store.state import ALL_STATUSES


def run_statuses(status: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """Statuses in upper case, each checked; None means every status."""
    if status is None:
        return None
    values = (status,) if isinstance(status, str) else tuple(status)
    out = tuple(v.upper() for v in values)
    for v in out:
        if v not in ALL_STATUSES:
            raise ValueError(f"unknown run status {v!r}; use one of {', '.join(ALL_STATUSES)}")
    return out


def cluster_of(spec: RunSpec, cluster: str | None = None) -> str:
    """Where a submission goes: the cluster asked for, else the spec's, else the local one."""
    return cluster or spec.compute.cluster or LOCAL


def os_user() -> str | None:
    """Who submits a run when nobody is named: the OS user, or None if the system cannot tell."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):   # no USER/LOGNAME and no passwd entry (some containers)
        return None


def as_spec(spec: RunSpec | dict[str, Any] | str | Path) -> RunSpec:
    """A validated RunSpec from a RunSpec, a dict, a YAML/JSON file's path or a YAML string."""
    if isinstance(spec, RunSpec):
        return spec
    if isinstance(spec, dict):
        return validate_spec(spec)
    if isinstance(spec, Path) or (isinstance(spec, str) and "\n" not in spec and Path(spec).suffix in
                                  (".yaml", ".yml", ".json")):
        return load_spec(spec)
    return parse_spec(spec)
