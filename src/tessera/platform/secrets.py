"""Typed secrets (s3 credentials, env, file) kept under `$TESSERA_HOME/secrets` with mode 0600.

Layout: `secrets/` (0700) holds `NAME.json` (0600) per secret; a file secret's bytes are in
`secrets/files/NAME/FILENAME` (0600). Values leave this module only as an `Injection` (the environment
and files a run receives) or inside a `Redactor` (which hides them in text shown to people).
`SecretInfo`, which `list` returns, has names and types, never values.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from tessera.platform.errors import SecretError
from tessera.platform.home import private_dir, tessera_home, write_private
from tessera.platform.spec import RESERVED_ENV, validate_name

REDACTED = "****"
MIN_REDACT_LEN = 4   # shorter values would turn every log line into asterisks; documented in platform.md
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Secret(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    created: float = Field(default_factory=time.time)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_name(value, "secret name")


class S3Secret(_Secret):
    """S3-compatible credentials, injected as AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, S3_ENDPOINT_URL
    (and AWS_ENDPOINT_URL), AWS_REGION: the variables `tessera.storage` and most S3 tools read."""
    type: Literal["s3"] = "s3"
    access_key_id: str = Field(min_length=1)
    secret_access_key: str = Field(min_length=1)
    endpoint: str | None = None
    region: str | None = None

    def env(self) -> dict[str, str]:
        out = {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        if self.endpoint:
            out.update(S3_ENDPOINT_URL=self.endpoint, AWS_ENDPOINT_URL=self.endpoint)
        if self.region:
            out["AWS_REGION"] = self.region
        return out

    def values(self) -> list[str]:
        return [self.access_key_id, self.secret_access_key]


class EnvSecret(_Secret):
    """Environment variables, injected as they are."""
    type: Literal["env"] = "env"
    values_: dict[str, str] = Field(alias="values", min_length=1)
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("values_")
    @classmethod
    def _keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_KEY.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by Tessera and cannot come from a secret")
        return value

    def env(self) -> dict[str, str]:
        return dict(self.values_)

    def values(self) -> list[str]:
        return list(self.values_.values())


class FileSecret(_Secret):
    """A file, mounted for the run; its path is handed over in `env_var`."""
    type: Literal["file"] = "file"
    filename: str
    env_var: str
    mount_path: str | None = Field(None, description="Where Kubernetes mounts it (local/Slurm use the stored path).")

    @field_validator("filename")
    @classmethod
    def _filename(cls, value: str) -> str:
        if not value or "/" in value or "\\" in value or value in (".", "..") or "\0" in value:
            raise ValueError(f"file name {value!r} must be a plain file name (no folders)")
        return value

    def env(self) -> dict[str, str]:
        return {}

    def values(self) -> list[str]:
        return []


Secret = Annotated[S3Secret | EnvSecret | FileSecret, Field(discriminator="type")]
_SECRET = TypeAdapter(Secret)


@dataclass(frozen=True)
class SecretInfo:
    """What `secret list` shows: never a value."""
    name: str
    type: str
    created: float
    exposes: list[str]          # names of env vars (or the file's env var and name), not their values


@dataclass
class Injection:
    """What a run receives from its secrets: environment variables and files (path on this machine,
    mount path for containers, env var that names it)."""
    env: dict[str, str] = field(default_factory=dict)
    files: list[tuple[Path, str, str]] = field(default_factory=list)


class Redactor:
    """Replaces every known secret value in a text with ****."""

    def __init__(self, values: list[str]) -> None:
        usable = sorted({v for v in values if len(v) >= MIN_REDACT_LEN}, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in usable)) if usable else None

    def __call__(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern and text else text

    def __bool__(self) -> bool:
        return self._pattern is not None


def default_env_var(secret_name: str) -> str:
    return "TESSERA_SECRET_" + re.sub(r"[^A-Za-z0-9]", "_", secret_name).upper()


class SecretStore:
    """The secrets of one TESSERA_HOME."""

    def __init__(self, home: str | Path | None = None) -> None:
        self.home = tessera_home(home)
        self.root = self.home / "secrets"

    def _dir(self) -> Path:
        return private_dir(self.root)

    def _path(self, name: str) -> Path:
        return self.root / f"{validate_name(name, 'secret name')}.json"

    def create(self, secret: S3Secret | EnvSecret | FileSecret, *, content: bytes | None = None,
               overwrite: bool = False) -> SecretInfo:
        """Store a secret (a file secret needs its `content`)."""
        path = self._path(secret.name)
        self._dir()
        if path.exists() and not overwrite:
            raise SecretError(f"secret {secret.name!r} exists; remove it first (tessera secret remove "
                              f"{secret.name}) or pass overwrite")
        if isinstance(secret, FileSecret):
            if content is None:
                raise SecretError(f"file secret {secret.name!r} needs the file's content")
            folder = private_dir(private_dir(self.root / "files") / secret.name)
            for old in folder.iterdir():
                old.unlink()
            write_private(folder / secret.filename, content)
        write_private(path, secret.model_dump_json(by_alias=True).encode())
        return self._info(secret)

    def create_s3(self, name: str, access_key_id: str, secret_access_key: str, endpoint: str | None = None,
                  region: str | None = None, overwrite: bool = False) -> SecretInfo:
        return self.create(self._build(S3Secret, name=name, access_key_id=access_key_id,
                                       secret_access_key=secret_access_key, endpoint=endpoint, region=region),
                           overwrite=overwrite)

    def create_env(self, name: str, values: dict[str, str], overwrite: bool = False) -> SecretInfo:
        return self.create(self._build(EnvSecret, name=name, values=values), overwrite=overwrite)

    def create_file(self, name: str, source: str | Path, env_var: str | None = None,
                    mount_path: str | None = None, overwrite: bool = False) -> SecretInfo:
        source = Path(source)
        try:
            content = source.read_bytes()
        except OSError as exc:
            raise SecretError(f"cannot read {source} for file secret {name!r}: {exc.strerror or exc}") from None
        secret = self._build(FileSecret, name=name, filename=source.name,
                             env_var=env_var or default_env_var(name), mount_path=mount_path)
        return self.create(secret, content=content, overwrite=overwrite)

    @staticmethod
    def _build(kind: type[_Secret], **fields: object) -> S3Secret | EnvSecret | FileSecret:
        try:
            return kind.model_validate(fields)  # type: ignore[return-value]
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise SecretError(f"invalid {kind.__name__}: {problems}") from None

    def get(self, name: str) -> S3Secret | EnvSecret | FileSecret:
        path = self._path(name)
        try:
            return _SECRET.validate_json(path.read_bytes())
        except FileNotFoundError:
            known = ", ".join(i.name for i in self.list()) or "none"
            raise SecretError(f"secret {name!r} does not exist (known: {known}); create it with "
                              f"`tessera secret create ...`") from None
        except ValidationError as exc:
            raise SecretError(f"secret file {path} is damaged: {exc.errors()[0]['msg']}") from None

    def file_path(self, secret: FileSecret) -> Path:
        return self.root / "files" / secret.name / secret.filename

    def list(self) -> list[SecretInfo]:
        if not self.root.exists():
            return []
        out = []
        for path in sorted(self.root.glob("*.json")):
            try:
                out.append(self._info(_SECRET.validate_json(path.read_bytes())))
            except ValidationError:
                continue
        return out

    def remove(self, name: str) -> None:
        path = self._path(name)
        if not path.exists():
            raise SecretError(f"secret {name!r} does not exist")
        path.unlink()
        shutil.rmtree(self.root / "files" / name, ignore_errors=True)

    @staticmethod
    def _info(secret: S3Secret | EnvSecret | FileSecret) -> SecretInfo:
        exposes = sorted(secret.env()) if not isinstance(secret, FileSecret) else [
            f"{secret.env_var} -> {secret.filename}"]
        return SecretInfo(secret.name, secret.type, secret.created, exposes)

    def injection(self, names: list[str]) -> Injection:
        """The env vars and files `names` give a run; later secrets win on a clash."""
        out = Injection()
        for name in names:
            secret = self.get(name)
            out.env.update(secret.env())
            if isinstance(secret, FileSecret):
                mount = secret.mount_path or f"/var/run/tessera/secrets/{secret.name}/{secret.filename}"
                out.files.append((self.file_path(secret), mount, secret.env_var))
        return out

    def redactor(self) -> Redactor:
        """Hides the value of every stored secret (not only a run's: a log may echo any of them)."""
        values: list[str] = []
        for info in self.list():
            secret = self.get(info.name)
            values.extend(secret.values())
            if isinstance(secret, FileSecret):
                values.extend(_file_values(self.file_path(secret)))
        return Redactor(values)


def _file_values(path: Path, limit: int = 65536) -> list[str]:
    """The text of a small file secret and its longer lines (a key file's lines may be logged alone)."""
    try:
        if path.stat().st_size > limit:
            return []
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) >= 8]
    return [text.strip(), *lines] if text.strip() else lines


def secret_json(info: SecretInfo) -> str:
    return json.dumps({"name": info.name, "type": info.type, "created": info.created, "exposes": info.exposes})
