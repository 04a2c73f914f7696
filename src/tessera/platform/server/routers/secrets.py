"""The team's secrets: names, types and the variables they expose go out; values only ever come in."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Response

from tessera.platform.server.auth import CurrentUser, State, TeamPlatform
from tessera.platform.server.params import SecretName
from tessera.platform.server.schemas import NewSecret

router = APIRouter(prefix="/secrets", tags=["secrets"])


@router.get("")
def list_secrets(platform: TeamPlatform) -> dict[str, Any]:
    return {"secrets": [asdict(info) for info in platform.secrets.list()]}


@router.post("", status_code=201)
def create_secret(body: NewSecret, who: CurrentUser, state: State, platform: TeamPlatform) -> dict[str, Any]:
    """Any type the platform knows, from its fields; a file's content as base64 text. Of clients racing to
    create one name without `overwrite`, one gets 201 and the others 409 (the store decides); with it,
    each gets 201 and the stored secret is one of theirs, whole."""
    with state.audit.change(who, "secret create", body.name,
                            f"type {body.type}" + (" (replaced)" if body.overwrite else "")):
        info = platform.secrets.create(body.type, body.name, overwrite=body.overwrite, **(body.model_extra or {}))
    return asdict(info)


@router.delete("/{name}", status_code=204)
def remove_secret(name: SecretName, who: CurrentUser, state: State, platform: TeamPlatform) -> Response:
    with state.audit.change(who, "secret remove", name):
        platform.secrets.remove(name)
    return Response(status_code=204)
