"""The team's secrets: names, types and the variables they expose go out; values only ever come in."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, HTTPException, Response

from tessera.platform.sdk import Platform
from tessera.platform.server.auth import CurrentUser, State, TeamPlatform
from tessera.platform.server.params import SecretName
from tessera.platform.server.schemas import NewSecret

router = APIRouter(prefix="/secrets", tags=["secrets"])


@router.get("")
def list_secrets(platform: TeamPlatform) -> dict[str, Any]:
    return {"secrets": [asdict(info) for info in platform.secrets.list()]}


@router.post("", status_code=201)
def create_secret(body: NewSecret, who: CurrentUser, state: State, platform: TeamPlatform) -> dict[str, Any]:
    """Any type the platform knows, from its fields; a file's content as base64 text."""
    if not body.overwrite and _exists(platform, body.name):
        raise HTTPException(409, f"secret {body.name!r} exists; remove it first or pass overwrite")
    info = platform.secrets.create(body.type, body.name, overwrite=body.overwrite, **(body.model_extra or {}))
    state.audit.record(who, "secret create", body.name, f"type {info.type}" + (" (replaced)" if body.overwrite else ""))
    return asdict(info)


@router.delete("/{name}", status_code=204)
def remove_secret(name: SecretName, who: CurrentUser, state: State, platform: TeamPlatform) -> Response:
    if not _exists(platform, name):
        raise HTTPException(404, f"no secret named {name!r}")
    platform.secrets.remove(name)
    state.audit.record(who, "secret remove", name)
    return Response(status_code=204)


def _exists(platform: Platform, name: str) -> bool:
    return name in {info.name for info in platform.secrets.list()}
