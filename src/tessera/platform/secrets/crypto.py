"""The key that encrypts secrets at rest (Fernet: AES-128-CBC + HMAC-SHA256, from `cryptography`).

Where it comes from, first match wins: `$TESSERA_SECRET_KEY` (a Fernet key), the file named by
`$TESSERA_SECRET_KEY_FILE`, else `<home>/secret.key`. A key file that does not exist is created on first
use with mode 0600 and linked into place without replacing one another process made meanwhile (two
processes racing must end up with the same key, or one of them would encrypt with a key nobody keeps).
The key itself is never put in a message, a log or an exception.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from tessera.platform.errors import SecretError
from tessera.platform.home import write_private

ENV_SECRET_KEY = "TESSERA_SECRET_KEY"
ENV_SECRET_KEY_FILE = "TESSERA_SECRET_KEY_FILE"
KEY_FILE = "secret.key"
_NOT_A_KEY = "is not a Fernet key (32 url-safe base64-encoded bytes; make one with `python -c \"from " \
             "cryptography.fernet import Fernet; print(Fernet.generate_key().decode())\"`)"


def _fernet(key: bytes, source: str) -> Fernet:
    try:
        return Fernet(key.strip())
    except (ValueError, TypeError):
        raise SecretError(f"the secret key in {source} {_NOT_A_KEY}") from None


def _create_key_file(path: Path) -> None:
    """A new key, written 0600 from the first byte and linked into place, never over an existing file:
    when processes or a server's threads race, the first link wins and every one of them reads it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        write_private(path, Fernet.generate_key() + b"\n", exclusive=True)


def _read_key_file(path: Path) -> bytes:
    if not path.exists():
        _create_key_file(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise SecretError(f"the secret key file {path} can be read by other users (mode {mode:o}); "
                              f"run `chmod 600 {path}`")
        return path.read_bytes()
    except OSError as exc:
        raise SecretError(f"cannot read the secret key file {path}: {exc.strerror or exc}") from None


class SecretCipher:
    """Encrypts and decrypts the records of one secret store; the key is loaded on first use."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._fernet: Fernet | None = None
        self.source = ""
        self._fingerprint = ""

    def _key(self) -> Fernet:
        if self._fernet is None:
            env_key = os.environ.get(ENV_SECRET_KEY)
            key_file = os.environ.get(ENV_SECRET_KEY_FILE)
            if env_key:
                self.source = ENV_SECRET_KEY
                key = env_key.encode()
            else:
                path = Path(key_file).expanduser() if key_file else self.home / KEY_FILE
                self.source = f"{ENV_SECRET_KEY_FILE}={path}" if key_file else f"key file {path}"
                key = _read_key_file(path)
            self._fernet = _fernet(key, self.source)
            self._fingerprint = hashlib.sha256(key.strip()).hexdigest()[:16]
        return self._fernet

    def fingerprint(self) -> str:
        """A short one-way digest of the key (what the store records, to tell two keys apart): the key
        cannot be recovered from it."""
        self._key()
        return self._fingerprint

    def encrypt(self, data: bytes) -> bytes:
        return self._key().encrypt(data)

    def decrypt(self, token: bytes, name: str) -> bytes:
        fernet = self._key()
        try:
            return fernet.decrypt(token)
        except InvalidToken:
            raise SecretError(f"secret {name!r} cannot be decrypted with the configured key ({self.source}); "
                              f"set {ENV_SECRET_KEY} or {ENV_SECRET_KEY_FILE} to the key it was stored with, "
                              f"or remove the secret and create it again") from None
