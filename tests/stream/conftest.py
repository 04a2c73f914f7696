"""Fixtures every streaming test module shares."""

from __future__ import annotations

import helpers
import pytest


@pytest.fixture(autouse=True)
def single_process_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test process itself is a single rank, whatever the environment pytest runs in."""
    helpers.clear_world_env(monkeypatch)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A fork server of rank processes (reader_proc.py) for the module's tests."""
    srv = helpers.ReaderServer(tmp_path_factory.mktemp("server"))
    yield srv
    srv.close()
