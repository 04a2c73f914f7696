"""A server replica's supervision: a thread of the server process that makes supervision passes
(leased.py) over every team's runs, so "a replica died" has one meaning: its supervision died with it,
its leases expire, and another replica takes its runs over.

A pass runs every `poll` seconds, or at once when the API asks (`wake`: a run was submitted or asked to
stop). A pass that fails as a whole (the database unreachable) is logged and tried again at the next
one; the leases then expire by themselves if it lasts. Stopping (the server shutting down cleanly) gives
the leases up, so another replica takes the runs over at once.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from tessera.platform.store.leases import Replica
from tessera.platform.supervision.context import SupervisorSettings
from tessera.platform.supervision.leased import Supervision

STOP_WAIT = 30.0   # seconds a shutdown waits for the pass in progress


class ReplicaSupervision:
    def __init__(self, engine: Engine, replica: Replica, team_home: Callable[[str], Path],
                 settings: SupervisorSettings) -> None:
        self.settings = settings
        self.supervision = Supervision(engine, replica, team_home, settings)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tessera-supervision", daemon=True)
        self._thread.start()
        self.supervision.shipping.start()

    def wake(self) -> None:
        """Make the next pass now (a run needs acting on)."""
        self._wake.set()

    def _loop(self) -> None:
        last_error = ""
        while not self._stop.is_set():
            try:
                self.supervision.tick()
                last_error = ""
            except Exception as exc:   # the store is unreachable, or a bug: say so once, keep trying
                message = f"{type(exc).__name__}: {exc}"
                if message != last_error:
                    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervision pass failed (will retry): {message}\n"
                          f"{traceback.format_exc()}", file=sys.stderr, flush=True)
                    last_error = message
            self._wake.wait(self.settings.poll)
            self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT)
        self.supervision.stop()
