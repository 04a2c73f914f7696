"""Path and query parameters shared by the routers, validated before a handler touches a file: names as
`validate_name` allows them (no path traversal), bounded numbers and lengths."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query

from tessera.platform.server.schemas import NAME_MAX
from tessera.platform.spec.run_spec import validate_name

MAX_LIMIT = 1000
MAX_OFFSET = 10_000_000


def _run_name(name: Annotated[str, Path(max_length=NAME_MAX)]) -> str:
    return validate_name(name, "run name")


def _cluster_name(name: Annotated[str, Path(max_length=NAME_MAX)]) -> str:
    return validate_name(name, "cluster name")


def _secret_name(name: Annotated[str, Path(max_length=NAME_MAX)]) -> str:
    return validate_name(name, "secret name")


def _user_name(name: Annotated[str, Path(max_length=NAME_MAX)]) -> str:
    return validate_name(name, "user name")


RunName = Annotated[str, Depends(_run_name)]
ClusterName = Annotated[str, Depends(_cluster_name)]
SecretName = Annotated[str, Depends(_secret_name)]
UserName = Annotated[str, Depends(_user_name)]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
