"""The supervisor process: one long-running process per TESSERA_HOME that keeps runs alive.

It is started detached (its own session) by the CLI or SDK when a run needs watching, holds
`supervisor.lock` (flock) so only one runs, writes its pid to `supervisor.pid` (for `stop_supervisor`),
and keeps nothing in memory that matters: every pass reads the active runs from SQLite and advances
each one (`run_pass.step`: start it, watch it, end it, retry it). Killed and restarted, it picks up
where it was. It exits after `idle_exit` seconds with nothing to watch.

This module owns the process: the lock, the pid file, the loop and starting or stopping it. What a pass
does to a run is in run_pass.py, submission.py and retries.py; what they share, in supervisor_context.py.

    python -m tessera.platform.supervision.supervisor [--home DIR]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from tessera.platform.errors import PlatformError
from tessera.platform.home import tessera_home
from tessera.platform.store.state import ACTIVE, RUNNING, STARTING, STOPPING, RunRecord
from tessera.platform.supervision.context import SupervisorContext, SupervisorSettings, cluster_backend
from tessera.platform.supervision.run_pass import step

__all__ = ["Supervisor", "SupervisorSettings", "cluster_backend", "ensure_supervisor", "main",
           "stop_supervisor", "supervisor_running"]


class Supervisor:
    """The loop of one supervisor process over the runs of one TESSERA_HOME."""

    def __init__(self, home: str | Path | None = None, settings: SupervisorSettings | None = None) -> None:
        self.ctx = SupervisorContext.open(tessera_home(home), settings or SupervisorSettings.from_env())
        self.last_error: dict[str, str] = {}                # run id -> last error recorded as an event
        self.started = time.time()
        self._stop = False

    def run_forever(self) -> int:
        ctx = self.ctx
        lock = _try_lock(ctx.home)
        if lock is None:
            ctx.log("another supervisor holds the lock; exiting")
            return 0
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        (ctx.home / "supervisor.pid").write_text(str(os.getpid()))
        ctx.log(f"supervisor {os.getpid()} watching {ctx.home}")
        idle_since = time.monotonic()
        try:
            while not self._stop:
                active = self.tick()
                now = time.monotonic()
                if active:
                    idle_since = now
                elif now - idle_since > ctx.settings.idle_exit:
                    # Release first, then look again: a run submitted meanwhile either sees the lock free
                    # (and starts a new supervisor) or is seen here.
                    os.close(lock)
                    if not ctx.db.list_runs(ACTIVE):
                        ctx.log("nothing to watch; exiting")
                        return 0
                    lock = _try_lock(ctx.home)
                    if lock is None:
                        return 0
                    idle_since = now
                time.sleep(ctx.settings.poll)
        finally:
            try:
                if (ctx.home / "supervisor.pid").read_text() == str(os.getpid()):
                    (ctx.home / "supervisor.pid").unlink()
            except OSError:
                pass
        ctx.log("stopped by SIGTERM")
        return 0

    def tick(self) -> int:
        """One pass over every active run; returns how many are active."""
        ctx = self.ctx
        ctx.db.supervisor_beat(os.getpid(), self.started)
        runs = ctx.db.list_runs(ACTIVE)
        self._watch_nodes(runs)
        for run in sorted(runs, key=lambda r: r.created):
            try:
                step(ctx, run)
                self.last_error.pop(run.id, None)
            except Exception as exc:  # one broken run must not stop the others being watched
                message = f"{type(exc).__name__}: {exc}"
                if self.last_error.get(run.id) != message:   # once per distinct error, not every pass
                    self.last_error[run.id] = message
                    ctx.log(f"run {run.name}: {exc!r}\n{traceback.format_exc()}")
                    ctx.db.add_event(run.id, "supervisor_error", f"supervisor error (will retry): {message}")
        return len(runs)

    def _watch_nodes(self, runs: list[RunRecord]) -> None:
        """Remember which nodes look unhealthy, to name the culprit when a job ends in NODE_FAIL."""
        for cluster in {r.cluster for r in runs if r.status in (STARTING, RUNNING, STOPPING)}:
            try:
                backend = self.ctx.backend(cluster)
                if backend.type == "local":
                    continue
                seen = self.ctx.unhealthy.setdefault(cluster, {})
                for node in backend.nodes():
                    if not node.healthy:
                        seen[node.name] = time.time()
            except PlatformError:
                continue


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
