"""An object-store endpoint that accepts connections and never answers fails within TESSERA_S3_TIMEOUT.

Before the deadline each of six attempts waited out a 120 s request timeout (725 s in all) and the error
did not say which endpoint was silent. The server here is real: a thread whose socket accepts every
connection and never writes a byte.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.storage import RetryPolicy, TransientError, open_store
from tessera.storage.errors import EndpointTimeout
from tessera.storage.remote import client_options
from tessera.storage.retry import DEFAULT_TOTAL_TIMEOUT, TIMEOUT_ENV, total_timeout_from_env


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """http://127.0.0.1:PORT of a server that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)  # kept open, never read or written

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    server.close()
    for conn in held:
        conn.close()


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


@pytest.mark.usefixtures("short_timeout")
def test_every_operation_on_a_silent_endpoint_is_an_endpoint_timeout_naming_it(silent_endpoint: str) -> None:
    store = open_store("s3://bucket/prefix", endpoint=silent_endpoint)
    assert store.retry.total_timeout == 1.0
    for op in (lambda: store.get("k"), lambda: store.put("k", b"v"), lambda: store.head("k"),
               lambda: list(store.list())):
        with pytest.raises(EndpointTimeout) as info:
            op()
        assert isinstance(info.value, TransientError) and isinstance(info.value, TimeoutError)
        assert info.value.endpoint == silent_endpoint
        assert silent_endpoint in str(info.value) and "s3://bucket/prefix" in str(info.value)


@pytest.mark.usefixtures("short_timeout")
def test_the_cli_reports_the_silent_endpoint_in_one_line(silent_endpoint: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S3_ENDPOINT_URL", silent_endpoint)
    result = CliRunner().invoke(app, ["storage", "ls", "s3://bucket/x/"])
    output = " ".join(result.output.split())  # rich wraps long lines at 80 columns
    assert result.exit_code == 1, output
    assert output.startswith("error:") and "Traceback" not in output and silent_endpoint in output


def test_the_deadline_caps_the_connect_and_first_byte_waits() -> None:
    options = client_options(RetryPolicy(total_timeout=2.0), allow_http=True)
    assert options["connect_timeout"] == "2.0s" and options["read_timeout"] == "2.0s"
    assert RetryPolicy(total_timeout=2.0).silence == 4.0  # connect, then first byte


def test_the_default_deadline_is_well_under_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert RetryPolicy().total_timeout == DEFAULT_TOTAL_TIMEOUT <= 30


@given(st.text(max_size=12))
def test_the_timeout_variable_is_a_positive_number_or_a_clear_error(text: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TIMEOUT_ENV, text.replace("\x00", ""))
        try:
            value = total_timeout_from_env()
        except ValueError as err:
            assert str(err).startswith(f"{TIMEOUT_ENV}=") and "positive number of seconds" in str(err)
            return
        assert 0 < value < float("inf")
