"""The team's secrets: names, types and the variables they expose go out; values only ever come in."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Response

from tessera.platform.api.models import NewSecret, SecretList, SecretSummary
from tessera.platform.server.auth import CurrentUser, State, TeamPlatform
from tessera.platform.server.params import SecretName

router = APIRouter(prefix="/secrets", tags=["secrets"])


@router.get("")
def list_secrets(platform: TeamPlatform) -> SecretList:
    return SecretList(secrets=[SecretSummary.model_validate(asdict(info)) for info in platform.secrets.list()])


@router.post("", status_code=201)
def create_secret(body: NewSecret, who: CurrentUser, state: State, platform: TeamPlatform) -> SecretSummary:
    """Any type the platform knows, from its fields; a file's content as base64 text. Of clients racing to
    create one name without `overwrite`, one gets 201 and the others 409 (the store decides); with it,
    each gets 201 and the stored secret is one of theirs, whole."""
    with state.audit.change(who, "secret create", body.name,
                            f"type {body.type}" + (" (replaced)" if body.overwrite else "")):
        info = platform.secrets.create(body.type, body.name, overwrite=body.overwrite, **(body.model_extra or {}))
    return SecretSummary.model_validate(asdict(info))


@router.delete("/{name}", status_code=204, response_class=Response)
def remove_secret(name: SecretName, who: CurrentUser, state: State, platform: TeamPlatform) -> Response:
    with state.audit.change(who, "secret remove", name):
        platform.secrets.remove(name)
    return Response(status_code=204)
