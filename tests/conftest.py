"""Shared fixtures. Keep each fixture small; add new ones in their own section.

S3 fixtures run a real SeaweedFS server (tests/s3server.py). Nothing is skipped: if the server cannot
start, every test that needs it errors with the server's log.
"""

from __future__ import annotations

import atexit
import re
import uuid
from pathlib import Path

import pytest
import s3server

# --- S3 (SeaweedFS) ------------------------------------------------------------------------------


def start_s3_server(request: pytest.FixtureRequest) -> s3server.SeaweedServer:
    """Start a server that is cleaned up by the fixture finalizer, or at exit if that never runs."""
    server = s3server.start_server()
    atexit.register(server.cleanup)
    request.addfinalizer(server.cleanup)
    return server


@pytest.fixture(scope="session")
def s3_server(request: pytest.FixtureRequest) -> s3server.SeaweedServer:
    """One SeaweedFS server for the whole run. Do not kill it: use `private_s3_server` for faults."""
    return start_s3_server(request)


@pytest.fixture(scope="module")
def private_s3_server(request: pytest.FixtureRequest) -> s3server.SeaweedServer:
    """A server of the test module's own, which its tests may kill and restart."""
    return start_s3_server(request)


def unique_bucket_name(label: str = "t") -> str:
    """A DNS-like bucket name (3-63 chars: lowercase, digits, '-') unique to this call."""
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:40] or "t"
    return f"{slug}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def s3_env(s3_server: s3server.SeaweedServer) -> dict[str, str]:
    """S3_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION for the shared server."""
    return s3_server.env()


def set_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def s3_bucket(request: pytest.FixtureRequest, s3_server, s3_env, monkeypatch) -> str:
    """A fresh bucket on the shared server as 's3://NAME', with the S3 env vars set for the test."""
    name = unique_bucket_name(request.node.originalname)
    s3_server.create_bucket(name)
    set_env(monkeypatch, s3_env)
    return f"s3://{name}"


# --- one test, every backend ---------------------------------------------------------------------


@pytest.fixture(params=["local", "memory", "s3"])
def any_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store root on each backend: a local folder, memory://, an S3 bucket."""
    if request.param == "local":
        root = tmp_path / "store"
        root.mkdir()
        return str(root)
    if request.param == "memory":
        return f"memory://{unique_bucket_name(request.node.originalname)}"
    return request.getfixturevalue("s3_bucket")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that touches the S3 server with `s3` (so `-m "not s3"` runs without it)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        uses_s3 = any(name in item.fixturenames for name in ("s3_server", "private_s3_server", "s3_bucket"))
        if uses_s3 or (callspec is not None and callspec.params.get("any_store_url") == "s3"):
            item.add_marker(pytest.mark.s3)
