"""What the trackers share: the tracker's run id kept with the run's logs, so a resumed training run
continues the same tracker run; and the run's config as flat params with anything secret-looking dropped.

The id lives in `<log_dir>/<file>` and, when the run saves checkpoints, in `<save_folder>/logs/<file>`
too, so a run resumed on another machine (a platform restart on other nodes) finds it next to the
checkpoints it resumes from. It is read only when the trainer resumed (start_progress > 0): a run started
from scratch under a name used before gets a new tracker run, whose steps would otherwise collide.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tessera.storage import NotFound, StorageError
from tessera.train.logger_base import RunInfo

log = logging.getLogger(__name__)

# A key is dropped when it contains one of these anywhere ...
_SECRET_PARTS = ("secret", "password", "passwd", "apikey", "credential", "privatekey")
# ... or when one of its words (split at punctuation and camelCase) is one of these. `tokenizer` and
# `max_tokens` stay; `hf_token`, `accessKeyId` and `token_encoding_type` go: better a param lost than a
# secret logged.
_SECRET_WORDS = {"key", "keys", "token", "auth", "authorization", "pwd", "bearer", "cookie", "signature"}


def is_secret_key(key: str) -> bool:
    """True for config keys that may hold a secret: api_key, secret_access_key, hf_token, password..."""
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()) if w]
    return any(part in "".join(words) for part in _SECRET_PARTS) or bool(_SECRET_WORDS.intersection(words))


def without_secrets(config: Any) -> Any:
    """`config` with secret-looking keys dropped and passwords in URLs masked, nested shape kept."""
    if isinstance(config, dict):
        return {k: without_secrets(v) for k, v in config.items() if not is_secret_key(str(k))}
    if isinstance(config, (list, tuple)):
        return [without_secrets(v) for v in config]
    if isinstance(config, str) and "@" in config and "://" in config:
        return _mask_password(config)
    return config


def _mask_password(url: str) -> str:
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:  # not a URL after all (a bad port...): mask the part before the @
        return "***@" + url.rsplit("@", 1)[-1]


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"recipe.optimizer.lr": "0.0006", ...}: nested keys joined with '.', list items by index, values as
    text (JSON for anything but a string); secrets dropped first (without_secrets)."""
    out: dict[str, str] = {}
    items = config.items() if isinstance(config, dict) else enumerate(config)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list, tuple)) and value:
            out.update(flat_params(without_secrets(value), f"{name}."))
        elif not is_secret_key(name):
            out[name] = value if isinstance(value, str) else json.dumps(without_secrets(value), default=str)
    return {k: _mask_password(v) if "@" in v and "://" in v else v for k, v in out.items()}


class TrackerRunRecord:
    """A tracker's run id (and anything else it needs to resume) as a small JSON file with the run's logs."""

    def __init__(self, run: RunInfo, filename: str) -> None:
        self.path = run.log_dir / filename
        self.remote = run.remote
        self.resuming = run.start_progress > 0

    def previous(self) -> dict[str, Any] | None:
        """The record of the run this one resumes, or None (a fresh run, or no record anywhere)."""
        if not self.resuming:
            return None
        try:
            data = self.path.read_bytes() if self.path.exists() else self._remote_bytes()
            record = json.loads(data) if data else None
        except (OSError, StorageError, ValueError) as exc:
            log.warning("cannot read %s (%s): starting a new tracker run", self.path, exc)
            return None
        return record if isinstance(record, dict) else None

    def _remote_bytes(self) -> bytes | None:
        if self.remote is None:
            return None
        try:
            return self.remote.get(self.path.name)
        except NotFound:
            return None

    def save(self, record: dict[str, Any]) -> None:
        """Write the record locally and next to the checkpoints, before the first metric is logged."""
        data = json.dumps(record).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(data)
        if self.remote is not None:
            self.remote.put(self.path.name, data)
