"""`tessera login URL` and `tessera logout`: point every later command at a team's server.

The API key is read from a hidden prompt, or from stdin when that is not a terminal
(`tessera login URL < key.txt`), never from the command line, where shell history and `ps` would keep
it. It is checked against the server (GET /api/v1/whoami) before it is saved, with the URL, in
`$TESSERA_HOME/credentials.json` (mode 0600). TESSERA_API_URL / TESSERA_API_KEY, when set, win over it.
"""

from __future__ import annotations

import os
import sys

import typer

from tessera.cli.console import err, fail
from tessera.platform import PlatformError
from tessera.platform.api.client import RemotePlatform
from tessera.platform.api.connection import ENV_URL, forget_credentials, save_credentials


def _read_key() -> str:
    if sys.stdin.isatty():
        return str(typer.prompt("API key", hide_input=True)).strip()
    return sys.stdin.readline().strip()


def login(url: str = typer.Argument(..., help="The server, e.g. http://tessera.example.com:8080.")) -> None:
    """Check an API key against a Tessera server and keep both for later commands."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        fail(f"server URL {url!r} must start with http:// or https://", code=2)
    key = _read_key()
    if not key:
        fail("no API key given (type it at the prompt, or pipe it on stdin: tessera login URL < key.txt)", code=2)
    remote = RemotePlatform(url, key)
    try:
        who = remote.whoami()
    except PlatformError as exc:
        fail(exc)
    finally:
        remote.close()
    path = save_credentials(url, key)
    admin = ", admin" if who.get("admin") else ""
    err.print(f"logged in to {url} as {who.get('user')} (team {who.get('team')}{admin}); key saved in {path}")
    if os.environ.get(ENV_URL, "").strip():
        err.print(f"note: {ENV_URL} is set in this shell and wins over the saved credentials")


def logout() -> None:
    """Forget the server and key `tessera login` saved (commands then use this machine's platform)."""
    if forget_credentials():
        err.print("logged out: saved credentials removed")
    else:
        err.print("not logged in: no saved credentials")
