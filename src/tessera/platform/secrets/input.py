"""Where `tessera secret create ...` reads values from: the caller's environment, files, or stdin.

A value typed on the command line (`NAME=VALUE`) lands in shell history and is visible to every user
through `ps` while the command runs, so the CLI offers these three instead and keeps the old form only
with a warning. Errors here name the variable, file or line, never a value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

from tessera.platform.secrets.types import MAX_FILE_BYTES, SecretInputError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _key(text: str, where: str) -> str:
    key = text.strip()
    if not _KEY.match(key):
        # Not echoed: on a pasted line the text before '=' may be part of the secret itself.
        raise SecretInputError(f"{where}: the name before '=' is not a valid environment variable name "
                          "([A-Za-z_][A-Za-z0-9_]*)")
    return key


def _add(values: dict[str, str], key: str, value: str, where: str) -> None:
    if key in values:
        raise SecretInputError(f"{where}: {key} is given twice")
    values[key] = value


def parse_env_lines(text: str, source: str = "stdin") -> dict[str, str]:
    """`KEY=VALUE` lines (blank lines and `#` comments skipped; `export ` allowed, as in .env files).

    The value is everything after the first '=', kept as is: secrets may hold '=', '#' and spaces.
    """
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{source} line {number}"
        key, sep, value = stripped.removeprefix("export ").partition("=")
        if not sep:
            raise SecretInputError(f"{where}: expected KEY=VALUE (no '=' on the line)")
        _add(values, _key(key, where), value, where)
    return values


def values_from_arguments(pairs: Iterable[str]) -> dict[str, str]:
    """The deprecated `KEY=VALUE` arguments, each taken whole (a value may hold '=' or a newline)."""
    values: dict[str, str] = {}
    for number, pair in enumerate(pairs, 1):
        key, sep, value = pair.partition("=")
        where = f"argument {number}"
        if not sep:
            raise SecretInputError(f"{where}: expected KEY=VALUE (no '='); or use --from-env KEY")
        _add(values, _key(key, where), value, where)
    return values


def values_from_environ(specs: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """`KEY` takes $KEY; `KEY=VAR` takes $VAR under the name KEY."""
    values: dict[str, str] = {}
    for spec in specs:
        key, _, var = spec.partition("=")
        where = f"--from-env {spec}"
        key = _key(key, where)
        var = _key(var, where) if var else key
        if var not in environ:
            raise SecretInputError(f"{where}: the environment variable {var} is not set here")
        _add(values, key, environ[var], where)
    return values


def values_from_files(specs: Iterable[str]) -> dict[str, str]:
    """`KEY=PATH` takes the file's text, without one trailing newline (as `echo token > file` leaves)."""
    values: dict[str, str] = {}
    for spec in specs:
        key, sep, path = spec.partition("=")
        where = f"--from-file {spec}"
        if not sep or not path:
            raise SecretInputError(f"{where}: expected KEY=PATH")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretInputError(f"{where}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
        _add(values, _key(key, where), text.removesuffix("\n").removesuffix("\r"), where)
    return values


def merge_values(*groups: dict[str, str]) -> dict[str, str]:
    """One mapping from several sources; a key given by two of them is an error, not a silent override."""
    out: dict[str, str] = {}
    for group in groups:
        for key, value in group.items():
            _add(out, key, value, "secret values")
    return out


def read_limited(stream: BinaryIO, where: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """At most `limit` bytes; more is refused rather than held (a secret is a key or a token, not data)."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise SecretInputError(f"{where} holds more than {limit // 1024} KiB, the limit of a secret")
    return data


def content_from_file(path: str, what: str) -> bytes:
    """The bytes of a file the user named for a secret; errors name the file, never its content."""
    try:
        with open(Path(path).expanduser(), "rb") as f:
            return read_limited(f, f"{what} file {path}")
    except OSError as exc:
        raise SecretInputError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from None


def value_from_sources(what: str, *, path: str | None, env_var: str | None, stdin: BinaryIO | None,
                       environ: Mapping[str, str]) -> str | None:
    """One value (a password, a key) from the one source given: a file or stdin (one trailing newline
    dropped, as `echo token > file` leaves), or a variable of this environment. None: no source given."""
    given = [flag for flag, value in (("--from-file", path), ("--from-env", env_var), ("--stdin", stdin))
             if value is not None]
    if len(given) > 1:
        raise SecretInputError(f"give the {what} one way, not {' and '.join(given)}")
    if env_var is not None:
        if env_var not in environ:
            raise SecretInputError(f"--from-env {env_var}: the environment variable {env_var} is not set here")
        return environ[env_var]
    if path is None and stdin is None:
        return None
    raw = content_from_file(path, what) if path is not None else read_limited(stdin, "stdin")  # type: ignore[arg-type]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretInputError(f"the {what} from {given[0]} is not UTF-8 text") from None
    return text.removesuffix("\n").removesuffix("\r")
