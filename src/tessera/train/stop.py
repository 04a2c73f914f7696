"""Stopping a run from outside: SIGTERM (a scheduler's or the platform's "checkpoint and stop") and SIGINT
(Ctrl-C) ask the trainer to stop after the current step, with a checkpoint of that step.

    with stop_on_signals(trainer) as stop:
        trainer.fit()
    return stop.exit_code(trainer)       # 0 when the run reached max_duration, else 128 + the signal

The process then exits 143 (SIGTERM) or 130 (SIGINT), so a supervisor tells a requested stop from a
finished run, and the same command resumes from the checkpoint. A second Ctrl-C (or a SIGTERM after the
Ctrl-C) ends the process at once, by the signal's default action: nothing more is saved (a save in flight
is not committed, so resuming takes the one before).

Every rank of a job must stop after the same step (a rank that stopped alone would leave the others
waiting in a collective), so the handler only notes the request (`Trainer.request_stop`) and the ranks
agree on it with the step's sample counts. Under torchrun the launcher forwards the signal to every rank
(`tessera.train.launch`). A SIGINT ignored when the process started (a background job of a shell script)
stays ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tessera.train.trainer import Trainer

_NOTICE = {signal.SIGINT: "Ctrl-C: stopping after this step with a checkpoint (Ctrl-C again aborts at once, "
                          "without one)",
           signal.SIGTERM: "SIGTERM: stopping after this step with a checkpoint"}


class StopSignals:
    """The signals this run received (`received`), and what the process exits with."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.received: list[int] = []

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        """Runs on the main thread between two bytecodes: it only sets flags and writes one line."""
        if signum == signal.SIGINT:  # what follows a Ctrl-C has its default action, at once: a second Ctrl-C,
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # or the SIGTERM torchrun sends its ranks when a
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # second Ctrl-C ends its wait for them
        if not self.received and self.trainer.rank == 0:
            os.write(2, f"\n{_NOTICE.get(signum, 'stopping after this step')}\n".encode())  # no logging locks
        self.received.append(signum)
        self.trainer.request_stop()

    def exit_code(self, trainer: Trainer) -> int:
        """0 when the run reached its max_duration (a signal during the final save changes nothing), else
        128 + the first signal when one stopped it."""
        finished = trainer.timestamp.get(trainer.max_duration.unit) >= trainer.max_duration
        return 0 if finished or not self.received else 128 + self.received[0]


@contextlib.contextmanager
def stop_on_signals(trainer: Trainer) -> Iterator[StopSignals]:
    """SIGTERM and SIGINT request a checkpoint and a stop while the block runs (module docstring); the
    previous handlers come back after it."""
    stop = StopSignals(trainer)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig, before in previous.items():
        if not (sig == signal.SIGINT and before == signal.SIG_IGN):
            signal.signal(sig, stop.handle)
    try:
        yield stop
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)
