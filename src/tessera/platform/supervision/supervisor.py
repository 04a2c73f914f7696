"""The standalone supervisor: one long-running process per TESSERA_HOME that keeps its runs alive.

It is started detached (its own session) by the CLI or SDK when a run needs watching, holds
`supervisor.lock` (flock) so only one runs, writes its pid to `supervisor.pid` (for `stop_supervisor`),
and keeps nothing in memory that matters: every pass reads the active runs from the home's store and
advances each one (leased.py: under leases, as a server replica does; its replica id is the home's, so a
supervisor started again after a crash holds the leases of the one before at once). Killed and
restarted, it picks up where it was. It exits after `idle_exit` seconds with nothing to watch.

This module owns the process: the lock, the pid file, the loop and starting or stopping it. What a pass
does is in leased.py, and what it does to a run in run_pass.py, submission.py and retries.py.

    python -m tessera.platform.supervision.supervisor [--home DIR]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tessera.platform.home import tessera_home
from tessera.platform.store.leases import Replica
from tessera.platform.store.state import ACTIVE, StateDB
from tessera.platform.supervision.context import SupervisorSettings, cluster_backend
from tessera.platform.supervision.leased import Supervision

__all__ = ["Supervisor", "SupervisorSettings", "cluster_backend", "ensure_supervisor", "main",
           "stop_supervisor", "supervisor_running"]


def home_replica(home: Path) -> Replica:
    """The replica id of a home's supervisor: the same for every supervisor of this home on this host
    (the lock lets one run at a time), so a restarted one renews the leases the one before held."""
    digest = hashlib.sha256(f"{socket.gethostname()}:{home}".encode()).hexdigest()[:12]
    return Replica(f"home-{digest}")


class Supervisor:
    """The loop of one supervisor process over the runs of one TESSERA_HOME."""

    def __init__(self, home: str | Path | None = None, settings: SupervisorSettings | None = None) -> None:
        self.home = tessera_home(home)
        self.settings = settings or SupervisorSettings.from_env()
        self.state = StateDB.local(self.home)
        self.supervision = Supervision(self.state.engine, home_replica(self.home), lambda _team: self.home,
                                       self.settings)
        self._stop = False

    def log(self, message: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}", file=sys.stderr, flush=True)

    def run_forever(self) -> int:
        lock = _try_lock(self.home)
        if lock is None:
            self.log("another supervisor holds the lock; exiting")
            return 0
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        (self.home / "supervisor.pid").write_text(str(os.getpid()))
        self.log(f"supervisor {os.getpid()} watching {self.home}")
        idle_since = time.monotonic()
        self.supervision.shipping.start()
        try:
            while not self._stop:
                active = self.tick()
                now = time.monotonic()
                if active:
                    idle_since = now
                elif now - idle_since > self.settings.idle_exit:
                    # Release first, then look again: a run submitted meanwhile either sees the lock free
                    # (and starts a new supervisor) or is seen here.
                    os.close(lock)
                    if not self.state.count_runs(ACTIVE):
                        self.log("nothing to watch; exiting")
                        return 0
                    lock = _try_lock(self.home)
                    if lock is None:
                        return 0
                    idle_since = now
                time.sleep(self.settings.poll)
        finally:
            self.supervision.shipping.stop()
            try:
                if (self.home / "supervisor.pid").read_text() == str(os.getpid()):
                    (self.home / "supervisor.pid").unlink()
            except OSError:
                pass
        self.log("stopped by SIGTERM")
        return 0

    def tick(self) -> int:
        """One pass over every active run; returns how many are active."""
        return self.supervision.tick()


# --- starting the supervisor ----------------------------------------------------------------------


def _try_lock(home: Path) -> int | None:
    fd = os.open(home / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def supervisor_running(home: str | Path | None = None) -> bool:
    fd = _try_lock(tessera_home(home))
    if fd is None:
        return True
    os.close(fd)
    return False


def ensure_supervisor(home: str | Path | None = None, env: dict[str, str] | None = None) -> bool:
    """Start a detached supervisor for `home` unless one is running; True if one was started."""
    home = tessera_home(home)
    if supervisor_running(home):
        return False
    log = open(home / "supervisor.log", "ab")
    try:
        # -c rather than -m: the package __init__ already imports this module (runpy would warn)
        subprocess.Popen([sys.executable, "-c", "import sys; from tessera.platform.supervision.supervisor import main; "
                          "sys.exit(main(sys.argv[1:]))", "--home", str(home)],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                         close_fds=True, env={**os.environ, **(env or {})})
    finally:
        log.close()
    return True


def stop_supervisor(home: str | Path | None = None, timeout: float = 10.0) -> bool:
    """SIGTERM the supervisor of `home` (runs keep going) and wait for it; True if one was stopped."""
    home = tessera_home(home)
    if not supervisor_running(home):
        return False   # a pid file left by a supervisor that was killed may name another process now
    try:
        pid = int((home / "supervisor.pid").read_text())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and supervisor_running(home):
        time.sleep(0.05)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.platform.supervision.supervisor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", default=None, help="TESSERA_HOME (default: $TESSERA_HOME or ~/.tessera)")
    args = parser.parse_args(argv)
    return Supervisor(args.home).run_forever()


if __name__ == "__main__":
    sys.exit(main())
