"""Reading what a run reports (the contract is in docs/platform.md, "What a run reports").

`TESSERA_HEARTBEAT` names a file that rank 0 replaces atomically with one JSON object
({"step", "time", "status", "last_checkpoint", ...}); events ({"kind": "checkpoint", "step", "url",
"time", ...}) are appended as JSON lines to `<heartbeat>.events.jsonl`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def events_path(heartbeat: Path) -> Path:
    return heartbeat.with_name(heartbeat.name + ".events.jsonl")


def read_heartbeat(path: Path) -> dict[str, Any] | None:
    """The newest heartbeat, or None if there is none (yet) or it is unreadable."""
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def read_events(path: Path, offset: int, limit: int = 1 << 20) -> tuple[list[dict[str, Any]], int]:
    """Complete event lines after byte `offset`, and the offset after the last complete line."""
    return read_json_lines(path, offset, limit)


def read_json_lines(path: Path, offset: int, limit: int = 1 << 20) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of the complete lines after byte `offset` (reading at most `limit` bytes), and the
    offset after the last complete line: a line still being written is read on the next call. Lines that
    are not JSON objects are skipped, and so is a line longer than `limit`, which would otherwise stop
    every later line from being read."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read(limit)
    except OSError:
        return [], offset
    end = chunk.rfind(b"\n")
    if end < 0:
        return [], offset + (len(chunk) if len(chunk) >= limit else 0)
    events = []
    for line in chunk[:end].splitlines():
        try:
            body = json.loads(line)
        except ValueError:
            continue
        if isinstance(body, dict):
            events.append(body)
    return events, offset + end + 1


def describe_event(body: dict[str, Any]) -> tuple[str, str]:
    """(kind, one-line message) for a run-reported event."""
    kind = str(body.get("kind") or "event")
    step = body.get("step")
    if kind == "checkpoint":
        where = body.get("url") or body.get("name") or ""
        return kind, f"checkpoint at step {step}: {where}".rstrip(": ")
    extras = ", ".join(f"{k}={v}" for k, v in body.items() if k not in ("kind", "time", "pid", "run_name"))
    return kind, f"{kind} ({extras})" if extras else kind
