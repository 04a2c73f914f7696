"""The CLI tests' platform: this machine's, on a fresh TESSERA_HOME (no server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.platform import Platform
from tessera.platform.supervision.supervisor import stop_supervisor

SETTINGS = {"TESSERA_SUPERVISOR_POLL": "0.2", "TESSERA_SUPERVISOR_IDLE": "60", "TESSERA_RETRY_BACKOFF": "0"}


@pytest.fixture
def platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Platform]:
    """A fresh TESSERA_HOME with a fast supervisor (tests/platform/conftest.py's settings) and no server."""
    for name in ("TESSERA_API_URL", "TESSERA_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**SETTINGS, "TESSERA_HOME": str(tmp_path / "home")}.items():
        monkeypatch.setenv(name, value)
    local = Platform(tmp_path / "home")
    yield local
    stop_supervisor(local.home)
    local.close()
