"""The secret types MCLI users create, each injected the way MCLI injects it (docs/secrets.md).

A type says which environment variables a run gets (`env`), which files are written for it (`files`,
each named to the run by one variable), and which environment variables name a written file's folder or
build a command around it (`path_env`). `values` lists what the Redactor hides in logs. File contents
are bytes: raw in Python, base64 in JSON (the HTTP API, and the encrypted records on disk).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_ssh_private_key
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tessera.platform.errors import SecretError
from tessera.platform.secrets.aws_ini import aws_profile, parse_ini
from tessera.platform.spec.schema import RESERVED_ENV, shorten, validate_name

MAX_FILE_BYTES = 64 * 1024     # a key, a credentials JSON, an AWS config: far smaller (the client's limit too)
MAX_VALUE_CHARS = 64 * 1024    # one environment variable's value
MAX_ENV_VARS = 256
MAX_FIELD_CHARS = 1024         # user names, servers, endpoints, account names
# A file secret's file name names a file in the run's folder (255 bytes at most); checked when a secret is
# made (parse_secret), not when one is read: a record an earlier version took still lists.
MAX_FILENAME_BYTES = 128
MOUNT_ROOT = "/secrets"        # MCLI mounts a secret's files in /secrets/<name>/
DOCKER_HUB = "https://index.docker.io/v1/"
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretInputError(SecretError, ValueError):
    """A value, file or option given for a secret is not acceptable (a usage error: exit 2, HTTP 422)."""


def _content(value: object) -> bytes:
    """Raw bytes as they are; a string is base64 (how JSON carries bytes)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("content must be base64 when given as text") from None
    raise ValueError("content must be bytes (or base64 text)")


Content = Annotated[bytes, BeforeValidator(_content),
                    PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str, when_used="json"),
                    Field(min_length=1, max_length=MAX_FILE_BYTES)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_FIELD_CHARS)]
Value = Annotated[str, Field(min_length=1, max_length=MAX_VALUE_CHARS)]


@dataclass(frozen=True)
class SecretFile:
    """A file written for the run: its name in the secret's folder, bytes, the variable that names its
    path, and where a container mounts it."""
    filename: str
    content: bytes
    env_var: str
    mount_path: str


def path_var(name: str) -> str:
    """MCLI's variable for a mounted secret's path: SECRET_PATH_<NAME upper-cased, '-' and '.' as '_'>."""
    return "SECRET_PATH_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def _text_values(content: bytes) -> list[str]:
    """The text of a small file and its longer lines (a key file's lines may be logged one by one)."""
    try:
        text = content.decode("utf-8").strip()
    except UnicodeDecodeError:
        return []
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) >= 8]
    return [text, *lines] if text else lines


def _absolute(value: str | None) -> str | None:
    if value is not None and (not value.startswith("/") or ".." in value.split("/") or "\0" in value):
        raise ValueError(f"mount path {value!r} must be an absolute path without '..'")
    return value


class _Secret(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    created: float = Field(default_factory=time.time)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name(value, "secret name")

    def env(self) -> dict[str, str]:
        return {}

    def files(self) -> list[SecretFile]:
        return []

    def path_env(self, paths: Mapping[str, Path]) -> dict[str, str]:
        """Variables built from where `files` were written (`paths`: filename -> path)."""
        return {}

    def values(self) -> list[str]:
        return []

    def exposes(self) -> list[str]:
        """Names (never values) of what a run gets: variables, and file variables with their file."""
        file_vars = [f"{f.env_var} -> {f.filename}" for f in self.files()]
        return sorted([*self.env(), *self.path_env({f.filename: Path(f.filename) for f in self.files()}),
                       *file_vars])


class S3Secret(_Secret):
    """S3-compatible credentials. As MCLI: a credentials and a config file (AWS_SHARED_CREDENTIALS_FILE,
    AWS_CONFIG_FILE; given, or written from the keys); as before: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    S3_ENDPOINT_URL (and AWS_ENDPOINT_URL), AWS_REGION, which `tessera.storage` reads."""
    type: Literal["s3"] = "s3"
    access_key_id: Text | None = None
    secret_access_key: Value | None = None
    endpoint: Text | None = None
    region: Text | None = None
    credentials: Content | None = None
    config: Content | None = None

    @model_validator(mode="after")
    def _keys(self) -> S3Secret:
        if self.credentials is not None and not (self.access_key_id and self.secret_access_key):
            profile = aws_profile(self.credentials, "credentials file")
            self.access_key_id = self.access_key_id or profile.get("aws_access_key_id")
            self.secret_access_key = self.secret_access_key or profile.get("aws_secret_access_key")
        if self.config is not None:
            aws_profile(self.config, "config file", need_profile=False)
        if not (self.access_key_id and self.secret_access_key):
            raise ValueError("an access key id and a secret access key are needed (or a credentials file "
                             "whose [default] profile has aws_access_key_id and aws_secret_access_key)")
        return self

    def env(self) -> dict[str, str]:
        out = {"AWS_ACCESS_KEY_ID": self.access_key_id or "", "AWS_SECRET_ACCESS_KEY": self.secret_access_key or ""}
        if self.endpoint:
            out.update(S3_ENDPOINT_URL=self.endpoint, AWS_ENDPOINT_URL=self.endpoint)
        if self.region:
            out["AWS_REGION"] = self.region
        return out

    def files(self) -> list[SecretFile]:
        credentials = self.credentials or (f"[default]\naws_access_key_id = {self.access_key_id}\n"
                                           f"aws_secret_access_key = {self.secret_access_key}\n").encode()
        config = self.config or ("[default]\n" + (f"region = {self.region}\n" if self.region else "")
                                 + (f"endpoint_url = {self.endpoint}\n" if self.endpoint else "")).encode()
        folder = f"{MOUNT_ROOT}/{self.name}"
        return [SecretFile("credentials", credentials, "AWS_SHARED_CREDENTIALS_FILE", f"{folder}/credentials"),
                SecretFile("config", config, "AWS_CONFIG_FILE", f"{folder}/config")]

    def values(self) -> list[str]:
        found = [self.access_key_id or "", self.secret_access_key or ""]
        if self.credentials:
            parser = parse_ini(self.credentials, "credentials file")
            found += [v for s in parser.sections() for k, v in parser[s].items() if k != "region"]
        return found


class EnvSecret(_Secret):
    """Environment variables, injected as they are."""
    type: Literal["env"] = "env"
    values_: dict[str, Value] = Field(alias="values", min_length=1, max_length=MAX_ENV_VARS)

    @field_validator("values_")
    @classmethod
    def _keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_KEY.match(key) or len(key) > 256:
                raise ValueError(f"{key[:64]!r} is not a valid environment variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by Tessera and cannot come from a secret")
        return value

    def env(self) -> dict[str, str]:
        return dict(self.values_)

    def values(self) -> list[str]:
        return list(self.values_.values())


class FileSecret(_Secret):
    """A file handed over by path in `env_var` (Tessera's own type; `mount_path` is the file's path in a
    container, default /var/run/tessera/secrets/<name>/<filename>)."""
    type: Literal["file"] = "file"
    filename: Text
    env_var: Text
    mount_path: str | None = None
    content: Content

    _mount = field_validator("mount_path")(_absolute)

    @field_validator("filename")
    @classmethod
    def _filename(cls, value: str, info: ValidationInfo) -> str:
        if "/" in value or "\\" in value or value in (".", "..") or "\0" in value:
            raise ValueError(f"file name {shorten(value)!r} must be a plain file name (no folders)")
        size = len(value.encode("utf-8"))
        if (info.context or {}).get("new") and size > MAX_FILENAME_BYTES:
            raise ValueError(f"file name {shorten(value)!r} is {size} bytes long; at most {MAX_FILENAME_BYTES} "
                             "are allowed (it is written as a file in the run's folder)")
        return value

    @field_validator("env_var")
    @classmethod
    def _env_var(cls, value: str) -> str:
        if not _ENV_KEY.match(value) or value in RESERVED_ENV:
            raise ValueError(f"{value!r} cannot name the file: not a valid or a reserved variable name")
        return value

    def files(self) -> list[SecretFile]:
        mount = self.mount_path or f"/var/run/tessera/secrets/{self.name}/{self.filename}"
        return [SecretFile(self.filename, self.content, self.env_var, mount)]

    def values(self) -> list[str]:
        return _text_values(self.content)


class MountedSecret(_Secret):
    """MCLI's `mounted` secret: a value written to `<mount_path>/secret` (default /secrets/<name>/secret),
    its path in SECRET_PATH_<NAME>."""
    type: Literal["mounted"] = "mounted"
    content: Content
    mount_path: str | None = Field(None, description="The folder of the file in a container (MCLI's --mount-path).")
    filename: ClassVar[str] = "secret"

    _mount = field_validator("mount_path")(_absolute)

    def _var(self) -> str:
        return path_var(self.name)

    def files(self) -> list[SecretFile]:
        folder = (self.mount_path or f"{MOUNT_ROOT}/{self.name}").rstrip("/")
        return [SecretFile(self.filename, self.content, self._var(), f"{folder}/{self.filename}")]

    def values(self) -> list[str]:
        return _text_values(self.content)


class SSHSecret(MountedSecret):
    """MCLI's `ssh` secret: a private key without a passphrase (runs cannot type one), mounted as a file."""
    type: Literal["ssh"] = "ssh"  # type: ignore[assignment]

    @field_validator("content")
    @classmethod
    def _key(cls, value: bytes) -> bytes:
        load = load_ssh_private_key if b"OPENSSH PRIVATE KEY" in value else load_pem_private_key
        try:
            load(value, password=None)
        except TypeError:
            raise ValueError("the SSH private key has a passphrase; runs are non-interactive, so give a key "
                             "without one (ssh-keygen -p -N '' -f KEY makes a copy without it)") from None
        except Exception:  # noqa: BLE001 - cryptography raises ValueError or UnsupportedAlgorithm
            raise ValueError("the content is not an SSH private key (PEM or OpenSSH format)") from None
        return value


class GitSSHSecret(SSHSecret):
    """MCLI's `git-ssh` secret: an SSH key, and GIT_SSH_COMMAND so `git` (and the git_repo integration's
    ssh_clone) uses it. The command names the key through its variable, which git's shell expands, so it
    holds on every cluster, wherever the file is."""
    type: Literal["git-ssh"] = "git-ssh"  # type: ignore[assignment]

    def path_env(self, paths: Mapping[str, Path]) -> dict[str, str]:
        return {"GIT_SSH_COMMAND": f'ssh -i "${self._var()}" -o IdentitiesOnly=yes '
                                   f'-o StrictHostKeyChecking=accept-new'}


class GCPSecret(MountedSecret):
    """MCLI's `gcp` secret: a service-account JSON file, its path in GOOGLE_APPLICATION_CREDENTIALS."""
    type: Literal["gcp"] = "gcp"  # type: ignore[assignment]
    _SENSITIVE: ClassVar[tuple[str, ...]] = ("private_key", "private_key_id", "client_secret", "refresh_token")

    @field_validator("content")
    @classmethod
    def _json(cls, value: bytes) -> bytes:
        try:
            data = json.loads(value)
        except (UnicodeDecodeError, ValueError):
            raise ValueError("the GCP credentials are not JSON (expected a service-account key file)") from None
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise ValueError('the GCP credentials JSON has no "type" (expected e.g. "service_account")')
        return value

    def _var(self) -> str:  # instead of SECRET_PATH_<NAME>, as MCLI
        return "GOOGLE_APPLICATION_CREDENTIALS"

    def values(self) -> list[str]:
        data = json.loads(self.content)
        found = [str(data[k]) for k in self._SENSITIVE if data.get(k)]
        return found + [line for v in found for line in v.splitlines() if len(line) >= 8]


class DockerRegistrySecret(_Secret):
    """MCLI's `docker` secret: registry credentials, as a Docker config.json (DOCKER_CONFIG names its
    folder; REGISTRY_AUTH_FILE, which podman reads, the file)."""
    type: Literal["docker-registry"] = "docker-registry"
    username: Text
    password: Value
    server: Text = DOCKER_HUB
    email: Text | None = None

    def _auth(self) -> str:  # what `docker login` writes: base64 of user:password
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode("ascii")

    def files(self) -> list[SecretFile]:
        entry = {"username": self.username, "password": self.password, "auth": self._auth()}
        entry.update({"email": self.email} if self.email else {})
        body = json.dumps({"auths": {self.server: entry}}, indent=1).encode()
        return [SecretFile("config.json", body, "REGISTRY_AUTH_FILE", f"{MOUNT_ROOT}/{self.name}/config.json")]

    def path_env(self, paths: Mapping[str, Path]) -> dict[str, str]:
        return {"DOCKER_CONFIG": str(paths["config.json"].parent)}

    def values(self) -> list[str]:
        return [self.password, self._auth()]


class AzureSecret(_Secret):
    """Azure storage account credentials: AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_ACCESS_KEY (what MosaicML's
    Streaming and Composer read), and AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY (the az CLI's names)."""
    type: Literal["azure"] = "azure"
    account_name: str = Field(pattern=r"^[a-z0-9]{3,24}$", description="3-24 lowercase letters and digits.")
    account_key: Value

    def env(self) -> dict[str, str]:
        return {"AZURE_ACCOUNT_NAME": self.account_name, "AZURE_ACCOUNT_ACCESS_KEY": self.account_key,
                "AZURE_STORAGE_ACCOUNT": self.account_name, "AZURE_STORAGE_KEY": self.account_key}

    def values(self) -> list[str]:
        return [self.account_key]


AnySecret = (S3Secret | EnvSecret | FileSecret | MountedSecret | SSHSecret | GitSSHSecret | GCPSecret
             | DockerRegistrySecret | AzureSecret)
Secret = Annotated[AnySecret, Field(discriminator="type")]
SECRET = TypeAdapter(Secret)
SECRET_TYPES = ("s3", "env", "file", "mounted", "ssh", "git-ssh", "gcp", "docker-registry", "azure")


def _problems(exc: ValidationError) -> str:
    """One line: each field and what is wrong with it, never the value given."""
    parts = []
    for e in exc.errors(include_input=False, include_url=False):
        where = ".".join(str(p) for p in e["loc"] if p not in SECRET_TYPES) or "secret"
        parts.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def parse_secret(data: Mapping[str, Any]) -> AnySecret:
    """A new typed secret from {"type", "name", ...fields}; fields left None are dropped (a client sends them)."""
    fields = {k: v for k, v in data.items() if v is not None}
    kind, name = fields.get("type"), fields.get("name")
    if kind not in SECRET_TYPES:
        raise SecretInputError(f"unknown secret type {kind!r}; use one of {', '.join(SECRET_TYPES)}")
    try:
        secret: AnySecret = SECRET.validate_python(fields, context={"new": True})
    except ValidationError as exc:
        raise SecretInputError(f"invalid {kind} secret {shorten(str(name))!r}: {_problems(exc)}") from None
    return secret
