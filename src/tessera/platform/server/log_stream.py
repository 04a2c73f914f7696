"""A run's logs followed live, for server-sent events.

Following a run means waiting, maybe for hours, for a quiet run to print. That wait must not hold one
of the server's worker threads (every handler runs on that pool: forty quiet followers would stop the
API), so each follower gets a thread of its own that reads the files, and the event loop waits on an
asyncio event. Lines are handed over in batches (one network write per batch, not per line) through a
bounded buffer, so a slow client slows its reader instead of filling memory. When the client goes
away, the reader stops at its next poll and closes its database connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from tessera.platform.api.sdk import Platform
from tessera.platform.errors import RunNotFound
from tessera.platform.runs import logs
from tessera.platform.runs.info import Run

MAX_BUFFERED = 5000   # lines read ahead of a slow client
KEEPALIVE = 15.0      # seconds of silence after which the stream sends a comment
WAIT = 0.25           # seconds between checks for a client that left, while the buffer is full


class _Disconnected(Exception):
    """Raised in the reader once its client has gone."""


class LogFeed:
    """Reads the run's lines in a thread of its own; `take()` waits for the next batch."""

    def __init__(self, platform: Platform, name: str, rank: int | None, resumption: int | None) -> None:
        self.platform, self.name, self.rank, self.resumption = platform, name, rank, resumption
        self.loop = asyncio.get_running_loop()
        self.ready = asyncio.Event()
        self.lock = threading.Condition()
        self.lines: list[str] = []
        self.end: str | None = None
        self.gone = threading.Event()
        threading.Thread(target=self._read, name=f"logs of {name}", daemon=True).start()

    async def take(self, timeout: float) -> tuple[list[str], str | None] | None:
        """(the lines read since the last call, the run's final status once the reader has finished), or
        None after `timeout` seconds without either."""
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError:
            return None
        with self.lock:
            lines, self.lines = self.lines, []
            self.ready.clear()
            self.lock.notify_all()
            return lines, self.end

    def stop(self) -> None:
        self.gone.set()
        with self.lock:
            self.lock.notify_all()

    def _current(self) -> Run:
        if self.gone.is_set():
            raise _Disconnected
        return self.platform.get_run(self.name)

    def _read(self) -> None:
        try:
            redact = self.platform.secrets.redactor()
            for line in logs.follow(self.platform.artifacts, self._current, redact, self.rank, self.resumption,
                                    follow=True):
                if not self._add(line):
                    return
            end = self._current().status
        except _Disconnected:
            return
        except RunNotFound:
            end = "DELETED"
        finally:
            self.platform.close()
        with self.lock:
            self.end = end
        self.loop.call_soon_threadsafe(self.ready.set)

    def _add(self, line: str) -> bool:
        with self.lock:
            while len(self.lines) >= MAX_BUFFERED:
                if self.gone.is_set():
                    return False
                self.lock.wait(WAIT)
            wake = not self.lines
            self.lines.append(line)
        if wake:
            self.loop.call_soon_threadsafe(self.ready.set)
        return True


async def sse_events(platform: Platform, name: str, rank: int | None, resumption: int | None
                     ) -> AsyncIterator[str]:
    """One `data:` event per line, then `event: end` with the run's final status (DELETED if it went)."""
    feed = LogFeed(platform, name, rank, resumption)
    try:
        while True:
            batch = await feed.take(KEEPALIVE)
            if batch is None:      # a comment, which clients ignore: proxies close connections idle for long
                yield ": keep-alive\n\n"
                continue
            lines, end = batch
            if lines:
                yield "".join(_event(line) for line in lines)
            if end is not None:
                yield f"event: end\ndata: {end}\n\n"
                return
    finally:
        feed.stop()


def _event(line: str) -> str:
    """Of a line rewritten with carriage returns (a progress bar) the last state is kept, as a terminal
    shows it (a bare CR would end the SSE line)."""
    return f"data: {line.rstrip(chr(13)).rsplit(chr(13), 1)[-1]}\n\n"
