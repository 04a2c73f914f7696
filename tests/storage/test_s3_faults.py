"""Faults on a real S3 server: SIGKILL mid-transfer, with and without a restart.

These tests kill their own server (`private_s3_server`, one per module), never the shared one. Loopback
GETs are too fast (~700 MiB/s) to kill a server in the middle of a 64 MiB download, so downloads go
through `ThrottledProxy`, a bandwidth-capped TCP relay in front of the real server.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import xxhash
from s3server import ThrottledProxy

from tessera.storage import RetryPolicy, StorageError, download, open_store

BIG = 64 << 20
PROXY_RATE = 32 << 20  # 64 MiB take ~2 s through the proxy
BUCKET = "faults"


@pytest.fixture(scope="module")
def server(private_s3_server):
    private_s3_server.create_bucket(BUCKET)
    return private_s3_server


@pytest.fixture(autouse=True)
def server_running_after_test(server):
    """Every test leaves the module's server up for the next one, whatever it did to it."""
    yield
    if not server.is_running():
        server.restart()


def store_options(server, endpoint: str | None = None, retry: RetryPolicy | None = None) -> dict:
    return dict(endpoint=endpoint or server.endpoint, access_key_id=server.access_key,
                secret_access_key=server.secret_key, region=server.region, retry=retry)


@pytest.fixture(scope="module")
def big_object(server, tmp_path_factory) -> tuple[str, str]:
    """A 64 MiB random object in the bucket: (url, xxh64)."""
    path = tmp_path_factory.mktemp("faults") / "big.bin"
    data = os.urandom(BIG)
    path.write_bytes(data)
    open_store(f"s3://{BUCKET}", **store_options(server)).put_file("big.bin", path)
    return f"s3://{BUCKET}/big.bin", xxhash.xxh64(data).hexdigest()


@pytest.fixture
def dl(tmp_path) -> Path:
    folder = tmp_path / "dl"
    folder.mkdir()
    return folder


class Background:
    """Run a call in a thread; keep its result or exception."""

    def __init__(self, fn) -> None:
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"still running after {timeout}s"


def wait_for_temp_file(folder: Path, timeout: float = 10.0) -> None:
    """The download has started writing once its hidden temp file exists."""
    deadline = time.monotonic() + timeout
    while not any(folder.iterdir()):
        assert time.monotonic() < deadline, "download never started"
        time.sleep(0.01)


# --- the server itself ------------------------------------------------------------------------------


def test_server_checks_credentials_and_keeps_data_across_sigkill(server):
    client = server.boto3_client()
    client.put_object(Bucket=BUCKET, Key="durable", Body=b"still here")
    bad = server.boto3_client(aws_secret_access_key="wrong")
    with pytest.raises(Exception, match="SignatureDoesNotMatch"):
        bad.get_object(Bucket=BUCKET, Key="durable")
    pid = server.pid
    server.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    server.restart()
    assert read_with_retries(server, "durable") == b"still here"


def read_with_retries(server, key: str, timeout: float = 10.0) -> bytes:
    """A restarted server may answer 500 for a moment while its parts reconnect."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return server.boto3_client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# --- SIGKILL in the middle of a 64 MiB download -----------------------------------------------------


def kill_server_mid_download(server, big_object, dl, retry: RetryPolicy, restart: bool) -> Background:
    """Start a throttled download of the big object, SIGKILL the server once the temp file exists
    (optionally restarting it a second later) and return the finished job."""
    url, digest = big_object
    dest = dl / "big.bin"
    with ThrottledProxy(server.ports["s3.port"], PROXY_RATE) as proxy:
        opts = store_options(server, endpoint=proxy.endpoint, retry=retry)
        job = Background(lambda: download(url, dest, size=BIG, hash=("xxh64", digest), **opts))
        wait_for_temp_file(dl)
        time.sleep(0.3)
        assert job.thread.is_alive(), "the download finished before the kill: nothing was tested"
        server.kill()
        if restart:
            time.sleep(1.0)
            server.restart()
        job.join(timeout=60 if restart else 30)
    return job


def test_download_survives_server_restart(server, big_object, dl):
    _, digest = big_object
    retry = RetryPolicy(max_attempts=12, base_delay=0.5, max_delay=2.0, connect_timeout=2.0,
                        request_timeout=30.0)
    dest = dl / "big.bin"
    job = kill_server_mid_download(server, big_object, dl, retry, restart=True)
    assert job.error is None, repr(job.error)
    assert job.result == BIG
    with open(dest, "rb") as f:
        assert xxhash.xxh64(f.read()).hexdigest() == digest
    assert sorted(p.name for p in dl.iterdir()) == ["big.bin"]


def test_interrupted_download_leaves_no_file(server, big_object, dl):
    retry = RetryPolicy(max_attempts=3, base_delay=0.1, max_delay=0.2, connect_timeout=1.0,
                        request_timeout=10.0)
    job = kill_server_mid_download(server, big_object, dl, retry, restart=False)
    assert isinstance(job.error, StorageError), repr(job.error)
    assert "big.bin" in str(job.error)
    assert list(dl.iterdir()) == [], "no file and no temp file may be left behind"


def test_requests_to_a_dead_server_fail_fast_with_storage_error(server):
    retry = RetryPolicy(max_attempts=2, base_delay=0.1, max_delay=0.1, connect_timeout=1.0)
    store = open_store(f"s3://{BUCKET}", **store_options(server, retry=retry))
    store.put("k", b"v")
    server.kill()
    start = time.monotonic()
    for op in (lambda: store.get("k"), lambda: store.put("k2", b"v"), lambda: list(store.list())):
        with pytest.raises(StorageError) as info:
            op()
        assert f"s3://{BUCKET}" in str(info.value)
    assert time.monotonic() - start < 10
    server.restart()
    assert store.get("k") == b"v"
