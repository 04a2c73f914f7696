"""Typed secrets, encrypted at rest (docs/secrets.md), in the store's `secrets` table: per team, one row per
secret holding its name, type, creation time and a Fernet token (crypto.py) of its JSON record, file
contents included, so no value is stored in the clear. The database decides between writers racing for
one name: without `overwrite` one insert wins and the others get SecretExists; with it each write
replaces the whole record (an upsert), so the stored record is always one acknowledged write, whole.

Secrets an older version kept as files under `<home>/secrets` (`NAME.secret` tokens, or `NAME.json` and
`files/NAME/FILENAME` in the clear before that) are imported into the table on first use, then deleted.
Values leave this module only as an `Injection` (the environment a run receives, and its files, decrypted
into the run's resumption folder at launch) or inside a `Redactor` (which hides them in text shown to
people). `SecretInfo`, which `list` returns, has names and types, never values.
"""

from __future__ import annotations

import errno
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.exc import IntegrityError

from tessera.platform.errors import SecretError, SecretExists, SecretNotFound
from tessera.platform.home import private_dir, tessera_home, write_private
from tessera.platform.secrets.crypto import ENV_SECRET_KEY, ENV_SECRET_KEY_FILE, SecretCipher
from tessera.platform.secrets.legacy_files import import_secret_files
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
from tessera.platform.store.audit import transaction
from tessera.platform.store.db import reading, upsert
from tessera.platform.store.homes import LOCAL_TEAM, home_engine
from tessera.platform.store.meta import KEY_FINGERPRINT, claim_setting
from tessera.platform.store.models import secrets

__all__ = [
    "SECRET_TYPES", "AnySecret", "AzureSecret", "DockerRegistrySecret", "EnvSecret", "FileSecret", "GCPSecret",
    "GitSSHSecret", "Injection", "MountedSecret", "Redactor", "S3Secret", "SSHSecret", "SecretInfo",
    "SecretInputError", "SecretStore", "default_env_var", "parse_secret", "secret_json",
]


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
    """The secrets of one team: `SecretStore(home)` is the standalone CLI's (team "local" of the home's
    store), `SecretStore(home, engine=E, team=T)` a server team's. `home` is where an older version's
    secret files may be, and where the key file is by default."""

    def __init__(self, home: str | Path | None = None, *, engine: Engine | None = None,
                 team: str = LOCAL_TEAM) -> None:
        self.home = tessera_home(home)
        self.root = self.home / "secrets"
        self.cipher = SecretCipher(self.home)
        self.engine = engine if engine is not None else home_engine(self.home)
        self.team = team
        self._imported = False

    def _key(self, name: str) -> Any:
        return (secrets.c.team == self.team) & (secrets.c.name == _name(name))

    # --- writing ----------------------------------------------------------------------------------

    def create(self, type_: str, name: str, *, overwrite: bool = False, **fields: Any) -> SecretInfo:
        """A secret of any type from its fields (as `RemoteSecrets.create`); file contents as bytes or
        base64 text. Raises SecretInputError for a bad field, SecretExists if it exists."""
        return self.add(parse_secret({**fields, "type": type_, "name": name}), overwrite=overwrite)

    def add(self, secret: AnySecret, *, overwrite: bool = False) -> SecretInfo:
        """Store a typed secret, encrypted (see the module's docstring for racing writers)."""
        self._import_files()
        row = {"team": self.team, "name": _name(secret.name), "type": secret.type, "created": secret.created,
               "token": self.cipher.encrypt(secret.model_dump_json(by_alias=True).encode())}
        try:
            with transaction(self.engine) as c:
                c.execute(upsert(c, secrets, row, ["team", "name"]) if overwrite else insert(secrets).values(**row))
        except IntegrityError:
            raise SecretExists(f"secret {secret.name!r} exists; remove it first (tessera secret remove "
                               f"{secret.name}) or pass overwrite") from None
        return _info(secret)

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
        self._import_files()
        with transaction(self.engine) as c:
            if c.execute(delete(secrets).where(self._key(name))).rowcount == 0:
                raise SecretNotFound(f"secret {name!r} does not exist")

    # --- reading ----------------------------------------------------------------------------------

    def get(self, name: str) -> AnySecret:
        self._import_files()
        with reading(self.engine) as c:
            token = c.execute(select(secrets.c.token).where(self._key(name))).scalar()
            if token is None:
                known = ", ".join(c.execute(select(secrets.c.name).where(secrets.c.team == self.team)
                                            .order_by(secrets.c.name)).scalars()) or "none"
                raise SecretNotFound(f"secret {name!r} does not exist (known: {known}); create it with "
                                     f"`tessera secret create ...`")
        return self._decrypt(name, token)

    def _decrypt(self, name: str, token: bytes) -> AnySecret:
        try:
            return SECRET.validate_json(self.cipher.decrypt(bytes(token), name))
        except ValidationError as exc:
            raise SecretError(f"secret {name!r} is damaged: {exc.errors()[0]['msg']}") from None

    def _all(self) -> list[AnySecret]:
        self._import_files()
        with reading(self.engine) as c:
            rows = c.execute(select(secrets.c.name, secrets.c.token).where(secrets.c.team == self.team)
                             .order_by(secrets.c.name)).all()
        return [self._decrypt(name, token) for name, token in rows]

    def list(self) -> list[SecretInfo]:
        return [_info(secret) for secret in self._all()]

    def _import_files(self) -> None:
        """Bring the secret files an older version left in the home into the table (once per store)."""
        if not self._imported:
            import_secret_files(self.engine, self.team, self.cipher, self.root)
            self._imported = True

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


def claim_secrets_key(engine: Engine, home: Path) -> str:
    """Check this process's secrets key against the one the store's secrets are encrypted with (by their
    fingerprints; the first replica records its key's). SecretError, in one line, if they differ: a
    replica with another key could read none of the secrets, and would store ones no other could read."""
    cipher = SecretCipher(home)
    mine = cipher.fingerprint()
    stored = claim_setting(engine, KEY_FINGERPRINT, mine)
    if stored != mine:
        raise SecretError(f"the secrets key ({cipher.source}, fingerprint {mine}) is not the key of this store's "
                          f"secrets (fingerprint {stored}): give every replica the same key, in "
                          f"{ENV_SECRET_KEY} or the file named by {ENV_SECRET_KEY_FILE}")
    return mine
