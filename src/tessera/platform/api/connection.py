"""Which platform a command talks to: a team's server, or this machine's store.

`connect()` looks, in order, at `TESSERA_API_URL` (with `TESSERA_API_KEY`), then at the credentials
`tessera login` saved in `$TESSERA_HOME/credentials.json` (mode 0600), and otherwise returns the local
`Platform`, so `tessera run ...` on one machine keeps working with no server.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tessera.platform.api.sdk import Platform
from tessera.platform.errors import PlatformError
from tessera.platform.home import tessera_home, write_private

if TYPE_CHECKING:
    from tessera.platform.api.client import RemotePlatform

ENV_URL = "TESSERA_API_URL"
ENV_KEY = "TESSERA_API_KEY"
CREDENTIALS = "credentials.json"


def credentials_path(home: str | Path | None = None) -> Path:
    return tessera_home(home) / CREDENTIALS


def save_credentials(url: str, api_key: str, home: str | Path | None = None) -> Path:
    """Keep the server's URL and key for later commands: written atomically, 0600 from the first byte."""
    path = credentials_path(home)
    write_private(path, json.dumps({"url": url, "api_key": api_key}).encode())
    return path


def load_credentials(home: str | Path | None = None) -> tuple[str, str] | None:
    """(url, key) saved by `tessera login`, or None. A damaged file is an error, not a silent local mode."""
    path = credentials_path(home)
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PlatformError(f"cannot read {path}: {exc}; run `tessera login URL` again or `tessera logout`"
                            ) from None
    if not (isinstance(data, dict) and isinstance(data.get("url"), str) and isinstance(data.get("api_key"), str)):
        raise PlatformError(f"{path} does not hold a url and an api_key; run `tessera login URL` again or "
                            "`tessera logout`")
    return data["url"], data["api_key"]


def forget_credentials(home: str | Path | None = None) -> bool:
    """Remove the saved credentials; False when there were none."""
    path = credentials_path(home)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def connect(home: str | Path | None = None) -> Platform | RemotePlatform:
    """The server named by the environment, else the one `tessera login` saved, else the local platform.
    With TESSERA_API_URL and no TESSERA_API_KEY, the saved key is used when it was saved for that URL."""
    from tessera.platform.api.client import RemotePlatform  # httpx only for those who use a server

    url, key = os.environ.get(ENV_URL, "").strip(), os.environ.get(ENV_KEY, "").strip()
    if url and key:
        return RemotePlatform(url, key)
    saved = load_credentials(home)
    if url:
        return RemotePlatform(url, saved[1] if saved and saved[0].rstrip("/") == url.rstrip("/") else None)
    if saved:
        return RemotePlatform(*saved)
    return Platform(home)
