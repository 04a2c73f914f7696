"""Typed secrets kept under `$TESSERA_HOME/secrets`, encrypted at rest (docs/secrets.md).

Layout: `secrets/` (0700) holds `NAME.secret` (0600) per secret: a Fernet token (secret_crypto.py) of the
secret's JSON record, file contents included, so no value is on disk in the clear. Records written in
the clear by earlier versions (`NAME.json`, and `files/NAME/FILENAME` for a file secret) are encrypted
on first access and the plaintext removed. Values leave this module only as an `Injection` (the
environment a run receives, and its files, decrypted into the run's resumption folder at launch) or
inside a `Redactor` (which hides them in text shown to people). `SecretInfo`, which `list` returns, has
names and types, never values.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tessera.platform.errors import SecretError, SecretExists, SecretNotFound
from tessera.platform.home import private_dir, tessera_home, write_private
from tessera.platform.secrets.crypto import SecretCipher
from tessera.platform.secrets.redaction import Redactor
from tessera.platform.secrets.types import (
    SECRET,
    SECRET_TYPES,
    AnySecret,
    AzureSecret,
    DockerRegistrySecret,
    EnvSecret,
    FileSecret,
    GCPSecret,
    GitSSHSecret,
    MountedSecret,
    S3Secret,
    SecretInputError,
    SSHSecret,
    parse_secret,
)
from tessera.platform.spec.run_spec import validate_name

__all__ = [
    "SECRET_TYPES", "AnySecret", "AzureSecret", "DockerRegistrySecret", "EnvSecret", "FileSecret", "GCPSecret",
    "GitSSHSecret", "Injection", "MountedSecret", "Redactor", "S3Secret", "SSHSecret", "SecretInfo",
    "SecretInputError", "SecretStore", "default_env_var", "parse_secret", "secret_json",
]

SUFFIX = ".secret"


@dataclass(frozen=True)
class SecretInfo:
    """What `secret list` shows: never a value."""
    name: str
    type: str
    created: float
    exposes: list[str]          # names of env vars (or a file's env var and name), not their values


@dataclass
class Injection:
    """What a run receives from its secrets: environment variables, and files (path on this machine,
    mount path for containers, the env var that names it)."""
    env: dict[str, str] = field(default_factory=dict)
    files: list[tuple[Path, str, str]] = field(default_factory=list)


def default_env_var(secret_name: str) -> str:
    return "TESSERA_SECRET_" + re.sub(r"[^A-Za-z0-9]", "_", secret_name).upper()


def _name(name: str) -> str:
    try:
        return validate_name(name, "secret name")
    except ValueError as exc:
        raise SecretInputError(str(exc)) from None


class SecretStore:
    """The secrets of one TESSERA_HOME."""

    def __init__(self, home: str | Path | None = None) -> None:
        self.home = tessera_home(home)
        self.root = self.home / "secrets"
        self.cipher = SecretCipher(self.home)

    def _path(self, name: str) -> Path:
        return self.root / f"{_name(name)}{SUFFIX}"

    # --- writing ----------------------------------------------------------------------------------

    def create(self, type_: str, name: str, *, overwrite: bool = False, **fields: Any) -> SecretInfo:
        """A secret of any type from its fields (as `RemoteSecrets.create`); file contents as bytes or
        base64 text. Raises SecretInputError for a bad field, SecretExists if it exists."""
        return self.add(parse_secret({**fields, "type": type_, "name": name}), overwrite=overwrite)

    def add(self, secret: AnySecret, *, overwrite: bool = False) -> SecretInfo:
        """Store a typed secret, encrypted. Without `overwrite`, the file system decides between writers
        racing for one name (the record is linked into place only where no file is): one wins, the
        others raise SecretExists, and the stored record is the winner's. With it, each writer replaces
        the whole record atomically: the last one stays, never a mix of two."""
        self._migrate()
        private_dir(self.root)
        try:
            self._write(secret, exclusive=not overwrite)
        except FileExistsError:
            raise SecretExists(f"secret {secret.name!r} exists; remove it first (tessera secret remove "
                               f"{secret.name}) or pass overwrite") from None
        return _info(secret)

    def _write(self, secret: AnySecret, exclusive: bool = False) -> None:
        record = secret.model_dump_json(by_alias=True).encode()
        write_private(self._path(secret.name), self.cipher.encrypt(record), exclusive=exclusive)

    def create_s3(self, name: str, access_key_id: str, secret_access_key: str, endpoint: str | None = None,
                  region: str | None = None, overwrite: bool = False) -> SecretInfo:
        return self.create("s3", name, access_key_id=access_key_id, secret_access_key=secret_access_key,
                           endpoint=endpoint, region=region, overwrite=overwrite)

    def create_env(self, name: str, values: dict[str, str], overwrite: bool = False) -> SecretInfo:
        return self.create("env", name, values=values, overwrite=overwrite)

    def create_file(self, name: str, source: str | Path, env_var: str | None = None,
                    mount_path: str | None = None, overwrite: bool = False) -> SecretInfo:
        source = Path(source)
        try:
            content = source.read_bytes()
        except OSError as exc:
            raise SecretInputError(f"cannot read {source} for file secret {name!r}: "
                                   f"{exc.strerror or exc}") from None
        return self.create("file", name, filename=source.name, env_var=env_var or default_env_var(name),
                           mount_path=mount_path, content=content, overwrite=overwrite)

    def remove(self, name: str) -> None:
        """Delete a secret; SecretNotFound if it is not there (also when another remover was first)."""
        self._migrate()
        try:
            self._path(name).unlink()
        except FileNotFoundError:
            raise SecretNotFound(f"secret {name!r} does not exist") from None

    # --- reading ----------------------------------------------------------------------------------

    def get(self, name: str) -> AnySecret:
        self._migrate()
        return self._read(name)

    def _read(self, name: str) -> AnySecret:
        path = self._path(name)
        try:
            token = path.read_bytes()
        except FileNotFoundError:
            known = ", ".join(p.name.removesuffix(SUFFIX) for p in sorted(self.root.glob(f"*{SUFFIX}"))) or "none"
            raise SecretNotFound(f"secret {name!r} does not exist (known: {known}); create it with "
                                 f"`tessera secret create ...`") from None
        try:
            return SECRET.validate_json(self.cipher.decrypt(token, name))
        except ValidationError as exc:
            raise SecretError(f"secret file {path} is damaged: {exc.errors()[0]['msg']}") from None

    def _all(self) -> list[AnySecret]:
        self._migrate()
        if not self.root.exists():
            return []
        return [self._read(path.name.removesuffix(SUFFIX)) for path in sorted(self.root.glob(f"*{SUFFIX}"))]

    def list(self) -> list[SecretInfo]:
        return [_info(secret) for secret in self._all()]

    def _migrate(self) -> None:
        """Encrypt records an earlier version wrote in the clear (NAME.json, files/NAME/*), then delete
        them. A record that no longer parses is left where it is, for a person to look at."""
        if not self.root.exists():
            return
        for path in sorted(self.root.glob("*.json")):
            name = path.stem
            try:
                record = json.loads(path.read_bytes())
                folder = self.root / "files" / name
                if record.get("type") == "file":
                    record["content"] = (folder / record["filename"]).read_bytes()
                secret = parse_secret(record)
            except (OSError, ValueError, KeyError, AttributeError, SecretError):
                continue
            self._write(secret)
            path.unlink(missing_ok=True)
            shutil.rmtree(self.root / "files" / name, ignore_errors=True)
        files = self.root / "files"
        if files.is_dir() and not any(files.iterdir()):
            with contextlib.suppress(OSError):   # another process or thread removed it first
                files.rmdir()

    # --- what runs and people get -----------------------------------------------------------------

    def injection(self, names: list[str], folder: Path | None = None) -> Injection:
        """The env vars and files `names` give a run; later secrets win on a clash. Files are decrypted
        into `<folder>/secrets/<secret>/` (0700 folders, 0600 files): `folder` is the resumption's, whose
        materialised secrets the cluster backend removes when the resumption ends."""
        out = Injection()
        for name in names:
            secret = self.get(name)
            out.env.update(secret.env())
            files = secret.files()
            if files and folder is None:
                raise SecretError(f"secret {name!r} holds files, which are written into the run's folder: "
                                  "the caller must pass the resumption folder")
            paths: dict[str, Path] = {}
            for f in files:
                target = private_dir(private_dir(Path(str(folder)) / "secrets") / secret.name) / f.filename
                try:
                    write_private(target, f.content)
                except OSError as exc:   # a name an earlier version accepted (too long): the run fails in one line
                    if exc.errno != errno.ENAMETOOLONG:
                        raise
                    raise SecretError(f"secret {name!r}: its file name ({len(f.filename.encode())} bytes) is too "
                                      "long to be written; create the secret again with a shorter one") from None
                paths[f.filename] = target
                out.files.append((target, f.mount_path, f.env_var))
            out.env.update(secret.path_env(paths))
        return out

    def redactor(self) -> Redactor:
        """Hides the value of every stored secret (not only a run's: a log may echo any of them)."""
        return Redactor([value for secret in self._all() for value in secret.values()])


def _info(secret: AnySecret) -> SecretInfo:
    return SecretInfo(secret.name, secret.type, secret.created, secret.exposes())


def secret_json(info: SecretInfo) -> str:
    return json.dumps({"name": info.name, "type": info.type, "created": info.created, "exposes": info.exposes})
