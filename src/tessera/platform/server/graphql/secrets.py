"""MCLI's secret operations on the team's SecretStore (`platform.secrets`): `createSecret`, `getSecrets`,
`deleteSecrets`, each change in its audit entry as the REST API makes it.

MCLI's kinds map onto Tessera's types of the same meaning (docs/platform.md): environment -> env,
mounted -> mounted, ssh -> ssh, git -> git-ssh, gcp -> gcp, docker_registry -> docker-registry, s3 -> s3
(its credentials and config files). sftp, oci and databricks secrets have no Tessera type and are
refused, each with what to use instead. Values go in; only names, types and where a run finds them
(`metadata`) come out.
"""

from __future__ import annotations

from typing import Any

from strawberry.types import Info

from tessera.platform.api.sdk import Platform
from tessera.platform.secrets.types import MOUNT_ROOT
from tessera.platform.secrets.vault import SecretInfo
from tessera.platform.server.accounts import Principal
from tessera.platform.server.graphql import types
from tessera.platform.server.graphql.context import Context, with_platform
from tessera.platform.server.graphql.inputs import CreateSecretInput, GetSecretsInput
from tessera.platform.server.graphql.views import iso

Ctx = Info[Context, Any]
MAPI_TYPE = {"env": "ENV_VAR", "azure": "ENV_VAR", "mounted": "MOUNTED", "file": "MOUNTED", "ssh": "SSH",
             "git-ssh": "GIT_SSH", "gcp": "GCP", "docker-registry": "DOCKER_REGISTRY", "s3": "S3"}
_MOUNTED = ("mounted", "ssh", "git-ssh", "gcp")
_REFUSED = {
    "sftp_ssh_secret": "an sftp secret has no Tessera type: create an `ssh` secret and point "
                       "COMPOSER_SFTP_KEY_FILE at its file (SECRET_PATH_<NAME>)",
    "oci_secret": "an oci secret has no Tessera type: use an `env` secret with the OCI_* variables",
    "databricks_secret": "a databricks secret has no Tessera type: use an `env` secret with DATABRICKS_HOST "
                         "and DATABRICKS_TOKEN",
}


def _text(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"createSecret {where}.value: must be text")
    return value.encode()


def _fields(kind: str, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(Tessera's type, the fields SecretsAPI.create takes) of one of MCLI's secret kinds."""
    meta, value, name = data.get("metadata") or {}, data.get("value"), data["name"]
    if kind == "env_var_secret":
        return "env", {"values": {meta.get("key"): value}}
    if kind == "docker_registry_secret":
        return "docker-registry", {k: v for k, v in (value or {}).items() if v is not None}
    if kind == "s3_secret":
        value = value or {}
        if value.get("profile") not in (None, "", "default"):
            raise ValueError(f"createSecret s3Secret.value.profile: {value['profile']!r}: Tessera reads the "
                             "[default] profile of the credentials file")
        if meta.get("mountDirectory") not in (None, f"{MOUNT_ROOT}/{name}"):
            raise ValueError(f"createSecret s3Secret.metadata.mountDirectory: Tessera mounts the files at "
                             f"{MOUNT_ROOT}/{name} (AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE name them)")
        return "s3", {k: _text(value[k], "s3Secret") for k in ("credentials", "config") if value.get(k)}
    tessera = {"mounted_secret": "mounted", "ssh_secret": "ssh", "git_ssh_secret": "git-ssh", "gcp_secret": "gcp"}
    return tessera[kind], {"content": _text(value, kind), "mount_path": meta.get("mountPath")}


def _metadata(platform: Platform, info: SecretInfo) -> dict[str, Any]:
    """Where a run finds the secret, as MCLI shows it (variable names, mount paths; no value)."""
    if MAPI_TYPE.get(info.type) == "ENV_VAR":
        return {"key": ", ".join(info.exposes)}
    if info.type in (*_MOUNTED, "file"):
        return {"mountPath": getattr(platform.secrets.get(info.name), "mount_path", None)
                or f"{MOUNT_ROOT}/{info.name}"}
    return {"mountDirectory": f"{MOUNT_ROOT}/{info.name}"} if info.type == "s3" else {}


def _view(platform: Platform, info: SecretInfo) -> types.Secret:
    return types.Secret(id=info.name, name=info.name, type=MAPI_TYPE.get(info.type, "ENV_VAR"),
                        metadata=_metadata(platform, info), created_at=iso(info.created) or "")


async def create_secret(info: Ctx, create_secret_data: CreateSecretInput) -> list[types.Secret]:
    given = {k: v for k, v in vars(create_secret_data).items() if k != "entity" and v is not None}
    state = info.context.state

    def work(platform: Platform, who: Principal) -> list[types.Secret]:
        if len(given) != 1:
            raise ValueError(f"createSecret takes one kind of secret; got {', '.join(sorted(given)) or 'none'}")
        (kind, data), = given.items()
        if kind in _REFUSED:
            raise ValueError(f"createSecret: {_REFUSED[kind]}")
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError(f"createSecret {kind}: needs a name")
        type_, fields = _fields(kind, data)
        with state.audit.change(who, "secret create", data["name"], f"type {type_}"):
            made = platform.secrets.create(type_, data["name"], **fields)
        return [_view(platform, made)]

    return await with_platform(info, work)


def _matching(platform: Platform, data: GetSecretsInput) -> list[SecretInfo]:
    f = data.filters
    names = f.name.in_ if f is not None and f.name is not None else None
    kinds = f.type.in_ if f is not None and f.type is not None else None
    return [s for s in platform.secrets.list() if (names is None or s.name in names)
            and (kinds is None or MAPI_TYPE.get(s.type) in kinds)]


async def get_secrets(info: Ctx, get_secrets_data: GetSecretsInput) -> list[types.Secret]:
    return await with_platform(info, lambda platform, _who: [_view(platform, s)
                                                             for s in _matching(platform, get_secrets_data)])


async def delete_secrets(info: Ctx, get_secrets_data: GetSecretsInput) -> list[types.Secret]:
    """The named secrets (filters.name.in; without names this would delete all, so it is refused)."""
    state = info.context.state
    f = get_secrets_data.filters

    def work(platform: Platform, who: Principal) -> list[types.Secret]:
        if f is None or f.name is None or not f.name.in_:
            raise ValueError("deleteSecrets needs filters.name.in: the names of the secrets")
        out = []
        for found in _matching(platform, get_secrets_data):
            view = _view(platform, found)
            with state.audit.change(who, "secret remove", found.name):
                platform.secrets.remove(found.name)
            out.append(view)
        return out

    return await with_platform(info, work)
