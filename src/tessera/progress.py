"""Progress of long work, for every layer: downloads and uploads (bytes), conversions and checks (items).

    with WorkProgress("downloading model", unit="bytes", total=size) as progress:
        download_from(store, key, path, progress=progress.advance)      # thread-safe
    with WorkProgress("verifying shards", console) as progress:
        verify_dataset(url, progress=progress.update)                   # update(done, total)

On a terminal: a rich bar with the count (or bytes), the rate and the time left, gone when the work ends
(the caller prints its summary). Not on a terminal (a CI log, a batch job's log file): a plain line
every `every` seconds, since a bar redrawn there is either nothing or thousands of lines; work shorter
than `every` prints none, and work that printed lines prints one more at its end. The bar is redrawn by
the updates themselves, never by a refresh thread: a caller may fork worker processes at any point
(forking is only safe while no other thread runs, shards/pool.py). Imports nothing of Tessera, so that
storage, shards, train, llm and the CLI all use this one.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

Unit = Literal["items", "bytes"]
REDRAW = 0.1  # seconds between two redraws of the bar


def duration(seconds: float) -> str:
    """3s, 1m52s, 2h05m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def human_bytes(n: float) -> str:
    """512 B, 1.5 KiB, 12.0 MiB, 3.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable: TiB ends the loop


def plain_line(description: str, done: int, total: int | None, seconds: float, unit: Unit = "items") -> str:
    """`verifying shards: 12,288/488,894 (2.5%), 4,096/s, 1m56s left`, or in bytes
    `downloading model: 12.0 MiB/48.0 MiB (25.0%), 4.0 MiB/s, 9s left`; without a total, the count and
    the rate only."""
    rate = done / seconds if seconds > 0 else 0.0
    count = human_bytes if unit == "bytes" else "{:,}".format
    speed = f"{human_bytes(rate)}/s" if unit == "bytes" else f"{rate:,.0f}/s"
    if total is None:
        return f"{description}: {count(done)}, {speed}"
    left = duration((total - done) / rate) if rate > 0 else "?"
    share = f" ({100 * done / total:.1f}%)" if total else ""
    return f"{description}: {count(done)}/{count(total)}{share}, {speed}, {left} left"


class WorkProgress:
    """`update(done, total)` or `advance(n)` as work is done; a bar or plain lines (see the module doc).
    `console` defaults to stderr's; `enabled=False` shows nothing (a rank other than 0, `--json`)."""

    def __init__(self, description: str, console: Console | None = None, every: float = 5.0, *,
                 unit: Unit = "items", total: int | None = None, enabled: bool = True) -> None:
        self.description, self.every, self.unit, self.enabled = description, every, unit, enabled
        self.console = console or Console(file=sys.stderr)
        self.done, self.total = 0, total
        self._bar: Progress | None = None
        self._task = 0
        self._lock = threading.Lock()  # advance() comes from a download's threads
        self._start = time.monotonic()
        self._last_line: float | None = None  # when the last plain line was printed
        self._last_draw = 0.0

    def __enter__(self) -> WorkProgress:
        self._start = time.monotonic()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif kind is None and self._last_line is not None and self.done != self.total:
            self._print(time.monotonic())  # the end of work whose total was unknown or not reached

    def advance(self, n: int) -> None:
        """`n` more bytes (or items) done."""
        with self._lock:
            self._show(self.done + n, self.total)

    def update(self, done: int, total: int | None = None) -> None:
        """`done` of `total` (None: the total given before, or unknown)."""
        with self._lock:
            self._show(done, self.total if total is None else total)

    def _show(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total
        if not self.enabled:
            return
        now = time.monotonic()
        if self.console.is_terminal:
            self._draw(now)
            return
        since = self._last_line if self._last_line is not None else self._start
        if now - since >= self.every or (self._last_line is not None and done == total):
            self._print(now)

    def _print(self, now: float) -> None:
        self._last_line = now
        self.console.print(plain_line(self.description, self.done, self.total, now - self._start, self.unit),
                           markup=False, highlight=False, soft_wrap=True)

    def _draw(self, now: float) -> None:
        if self._bar is None:
            counts = (DownloadColumn(), TransferSpeedColumn()) if self.unit == "bytes" else (
                MofNCompleteColumn(), TextColumn("{task.fields[rate]}"))
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), *counts, TaskProgressColumn(),
                                 TimeRemainingColumn(), console=self.console, transient=True, auto_refresh=False)
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=self.total, rate="")
        finished = self.total is not None and self.done >= self.total
        if now - self._last_draw < REDRAW and not finished:
            self._bar.update(self._task, completed=self.done, total=self.total)
            return
        self._last_draw = now
        rate = f"{self.done / max(now - self._start, 1e-9):,.0f}/s"
        self._bar.update(self._task, completed=self.done, total=self.total, rate=rate, refresh=True)
