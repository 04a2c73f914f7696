"""Path and query parameters shared by the routers, validated before a handler touches a file: names as
`validate_name` allows them (no path traversal), bounded numbers and lengths, and the paging of lists
(`cursor` from the previous page's `next_cursor`, `limit` items a page)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query

from tessera.platform.api.models import MAX_PAGE
from tessera.platform.spec.schema import NAME_MAX, validate_name

MAX_CURSOR = 200


def _run_name(name: Annotated[str, Path(max_length=NAME_MAX)]) -> str:
    return validate_name(name, "run name")


def _cluster_name(name: Annotated[str, Path(max_length=NAME_MAX)]) -> str:
    return validate_name(name, "cluster name")


def _secret_name(name: Annotated[str, Path(max_length=NAME_MAX)]) -> str:
    return validate_name(name, "secret name")


def _user_name(name: Annotated[str, Path(max_length=NAME_MAX)]) -> str:
    return validate_name(name, "user name")


def _user_filter(user: Annotated[str | None, Query(max_length=NAME_MAX, description="Only this user's.")] = None
                 ) -> str | None:
    return validate_name(user, "user name") if user else None


RunName = Annotated[str, Depends(_run_name)]
ClusterName = Annotated[str, Depends(_cluster_name)]
SecretName = Annotated[str, Depends(_secret_name)]
UserName = Annotated[str, Depends(_user_name)]
UserFilter = Annotated[str | None, Depends(_user_filter)]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Items per page.")]
Cursor = Annotated[str | None, Query(max_length=MAX_CURSOR, description="The `next_cursor` of the previous page.")]
