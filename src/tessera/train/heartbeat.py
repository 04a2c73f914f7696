"""The trainer's heartbeat, for the platform's hang detection.

Set `TESSERA_HEARTBEAT` to a file path or an http(s) URL (and optionally `TESSERA_HEARTBEAT_INTERVAL`,
seconds, default 30). Rank 0 then reports; with "{rank}" in the path every rank reports to its own file.

- File: every interval the file is replaced atomically (temp file + rename) by one JSON object
      {"kind": "heartbeat", "status": "running", "time": unix seconds, "pid", "rank", "run_name",
       "step", "epoch", "samples", "tokens", "last_checkpoint": {...} | null, ...}
  and events (`{"kind": "checkpoint", "name", "url", "step", "time", ...}`, fit start and end) are
  appended as lines to `<path>.events.jsonl`.
- URL: the same objects are POSTed as JSON by a background thread (a slow endpoint never blocks the
  loop; when heartbeats pile up, only the newest is sent; events are never dropped below 1000 queued).

`status` is "running" while training, then "finished" or "failed" on the last beat.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tessera.train.time import Timestamp

ENV_TARGET = "TESSERA_HEARTBEAT"
ENV_INTERVAL = "TESSERA_HEARTBEAT_INTERVAL"


class Heartbeat:
    """Rate-limited progress reports and events to a file or URL (module docstring)."""

    def __init__(self, target: str, *, interval: float = 30.0, run_name: str = "", rank: int = 0) -> None:
        self.target = target.replace("{rank}", str(rank))
        self.is_url = self.target.startswith(("http://", "https://"))
        self.interval, self.run_name, self.rank = interval, run_name, rank
        self._last_beat = -float("inf")
        self._last_checkpoint: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1000)
        self._sender: threading.Thread | None = None
        if self.is_url:
            self._sender = threading.Thread(target=self._send_loop, name="tessera-heartbeat", daemon=True)
            self._sender.start()
        else:
            Path(self.target).parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls, run_name: str, rank: int) -> Heartbeat | None:
        """The heartbeat `TESSERA_HEARTBEAT` asks for on this rank, or None."""
        target = os.environ.get(ENV_TARGET, "").strip()
        if not target or (rank != 0 and "{rank}" not in target):
            return None
        interval = float(os.environ.get(ENV_INTERVAL, "30") or 30)
        return cls(target, interval=interval, run_name=run_name, rank=rank)

    def _base(self, kind: str) -> dict[str, Any]:
        return {"kind": kind, "time": time.time(), "pid": os.getpid(), "rank": self.rank,
                "run_name": self.run_name}

    def beat(self, timestamp: Timestamp, *, status: str = "running", force: bool = False,
             **fields: Any) -> None:
        """Report progress if `interval` seconds have passed since the last report (or `force`)."""
        now = time.monotonic()
        if not force and now - self._last_beat < self.interval:
            return
        self._last_beat = now
        body = {**self._base("heartbeat"), "status": status, "step": timestamp.batch, "epoch": timestamp.epoch,
                "samples": timestamp.sample, "tokens": timestamp.token,
                "last_checkpoint": self._last_checkpoint, **fields}
        if self.is_url:
            self._offer(body, drop_if_full=True)
        else:
            with self._lock:
                _write_atomic(Path(self.target), json.dumps(body).encode())

    def event(self, kind: str, **fields: Any) -> None:
        """Report an event now ("checkpoint", "fit_start", "fit_end"); thread-safe."""
        body = {**self._base(kind), **fields}
        if kind == "checkpoint":
            self._last_checkpoint = {k: body[k] for k in ("name", "url", "step", "time") if k in body}
        if self.is_url:
            self._offer(body, drop_if_full=False)
        else:
            with self._lock, open(self.target + ".events.jsonl", "a", encoding="utf-8") as out:
                out.write(json.dumps(body) + "\n")

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (URL targets), waiting at most `timeout` seconds."""
        if self._sender is not None:
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:
                return
            self._sender.join(timeout)
            self._sender = None

    def _offer(self, body: dict[str, Any], drop_if_full: bool) -> None:
        try:
            self._queue.put(body, block=not drop_if_full, timeout=5.0)
        except queue.Full:
            pass  # the endpoint is down or slow; a newer heartbeat will follow

    def _send_loop(self) -> None:
        while True:
            body = self._queue.get()
            if body is None:
                return
            if body["kind"] == "heartbeat" and not self._queue.empty():
                continue  # a newer report is waiting
            request = urllib.request.Request(self.target, data=json.dumps(body).encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=10).close()
            except OSError:
                pass  # best effort: hang detection must not kill the run it watches


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
