"""Where `tessera secret create env` reads values from: the caller's environment, files, or stdin.

A value typed on the command line (`NAME=VALUE`) lands in shell history and is visible to every user
through `ps` while the command runs, so the CLI offers these three instead and keeps the old form only
with a warning. Errors here name the variable, file or line, never a value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from tessera.platform.errors import SecretError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _key(text: str, where: str) -> str:
    key = text.strip()
    if not _KEY.match(key):
        # Not echoed: on a pasted line the text before '=' may be part of the secret itself.
        raise SecretError(f"{where}: the name before '=' is not a valid environment variable name "
                          "([A-Za-z_][A-Za-z0-9_]*)")
    return key


def _add(values: dict[str, str], key: str, value: str, where: str) -> None:
    if key in values:
        raise SecretError(f"{where}: {key} is given twice")
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
            raise SecretError(f"{where}: expected KEY=VALUE (no '=' on the line)")
        _add(values, _key(key, where), value, where)
    return values


def values_from_arguments(pairs: Iterable[str]) -> dict[str, str]:
    """The deprecated `KEY=VALUE` arguments, each taken whole (a value may hold '=' or a newline)."""
    values: dict[str, str] = {}
    for number, pair in enumerate(pairs, 1):
        key, sep, value = pair.partition("=")
        where = f"argument {number}"
        if not sep:
            raise SecretError(f"{where}: expected KEY=VALUE (no '='); or use --from-env KEY")
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
            raise SecretError(f"{where}: the environment variable {var} is not set here")
        _add(values, key, environ[var], where)
    return values


def values_from_files(specs: Iterable[str]) -> dict[str, str]:
    """`KEY=PATH` takes the file's text, without one trailing newline (as `echo token > file` leaves)."""
    values: dict[str, str] = {}
    for spec in specs:
        key, sep, path = spec.partition("=")
        where = f"--from-file {spec}"
        if not sep or not path:
            raise SecretError(f"{where}: expected KEY=PATH")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretError(f"{where}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
        _add(values, _key(key, where), text.removesuffix("\n").removesuffix("\r"), where)
    return values


def merge_values(*groups: dict[str, str]) -> dict[str, str]:
    """One mapping from several sources; a key given by two of them is an error, not a silent override."""
    out: dict[str, str] = {}
    for group in groups:
        for key, value in group.items():
            _add(out, key, value, "secret values")
    return out
