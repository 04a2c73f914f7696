"""Secrets an older version kept as files under `<home>/secrets`, imported into the store's table.

Two layouts: `NAME.secret`, a Fernet token of the secret's JSON record (kept as it is: the same key
decrypts it), and before that `NAME.json` with `files/NAME/FILENAME` in the clear (encrypted now). Each
is decrypted or parsed first, so a file the configured key cannot open stops the import with the error
naming it, and nothing is deleted; a record that no longer parses is left where it is, for a person to
look at. Imported files are deleted once the rows are committed. A name the table already has keeps the
table's secret (the file is an older copy).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy import Engine

from tessera.platform.errors import SecretError
from tessera.platform.secrets.crypto import SecretCipher
from tessera.platform.secrets.types import SECRET, AnySecret, parse_secret
from tessera.platform.store.db import insert_or_ignore, writing
from tessera.platform.store.models import secrets

SUFFIX = ".secret"


def _plaintext(path: Path, root: Path) -> AnySecret | None:
    try:
        record = json.loads(path.read_bytes())
        if record.get("type") == "file":
            record["content"] = (root / "files" / path.stem / record["filename"]).read_bytes()
        return parse_secret(record)
    except (OSError, ValueError, KeyError, AttributeError, SecretError):
        return None


def import_secret_files(engine: Engine, team: str, cipher: SecretCipher, root: Path) -> int:
    """Import the secret files under `root` into `team`'s rows; returns how many were imported."""
    if not root.is_dir():
        return 0
    rows, done = [], []
    for path in sorted(root.glob(f"*{SUFFIX}")):
        token = path.read_bytes()
        try:
            secret = SECRET.validate_json(cipher.decrypt(token, path.name.removesuffix(SUFFIX)))
        except ValidationError:
            continue
        rows.append((secret, token))
        done.append(path)
    for path in sorted(root.glob("*.json")):
        plain = _plaintext(path, root)
        if plain is not None:
            rows.append((plain, cipher.encrypt(plain.model_dump_json(by_alias=True).encode())))
            done.append(path)
    if rows:
        with writing(engine) as c:
            for secret, token in rows:
                insert_or_ignore(c, secrets, {"team": team, "name": secret.name, "type": secret.type,
                                              "created": secret.created, "token": token}, ["team", "name"])
    for path in done:
        path.unlink(missing_ok=True)
        if path.suffix == ".json":
            shutil.rmtree(root / "files" / path.stem, ignore_errors=True)
    for folder in (root / "files", root):
        with contextlib.suppress(OSError):   # not empty (a record left for a person), or removed already
            folder.rmdir()
    return len(rows)
