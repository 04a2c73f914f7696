"""What a run reports: its logs (whole, or followed live as server-sent events), metrics and events.

Following reads the files in a worker thread. When the client goes away the stream is cancelled and a
flag stops that thread at its next poll, so a closed browser tab never keeps a thread waiting on a
run that prints nothing.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from tessera.platform import logs
from tessera.platform.errors import RunNotFound
from tessera.platform.run_info import Run
from tessera.platform.sdk import Platform
from tessera.platform.server.auth import CurrentUser, State, TeamPlatform
from tessera.platform.server.params import RunName

router = APIRouter(prefix="/runs", tags=["runs"])
MAX_RANK = 1_000_000
Index = Annotated[int | None, Query(ge=0, le=MAX_RANK)]


class _Disconnected(Exception):
    """Raised inside the following thread once its client has gone."""


@router.get("/{name}/logs", response_class=StreamingResponse,
            responses={200: {"content": {"text/plain": {}, "text/event-stream": {}}}})
def run_logs(name: RunName, who: CurrentUser, state: State, platform: TeamPlatform, rank: Index = None,
             resumption: Index = None, follow: bool = False) -> StreamingResponse:
    """follow=0: the lines so far, as text. follow=1: one `data:` event per line until the run ends, then
    `event: end` whose data is the run's final status."""
    platform.log_files(name, rank, resumption)   # a missing run, rank or resumption: 404 before streaming
    own = state.teams.open(who.team)             # the stream's own: it outlives this request's
    if not follow:
        return StreamingResponse(_text(own, name, rank, resumption), media_type="text/plain; charset=utf-8")
    return StreamingResponse(_events(own, name, rank, resumption), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _text(platform: Platform, name: str, rank: int | None, resumption: int | None) -> Iterator[str]:
    try:
        for line in platform.follow_logs(name, rank, resumption, follow=False):
            yield line + "\n"
    finally:
        platform.close()


async def _events(platform: Platform, name: str, rank: int | None, resumption: int | None) -> AsyncIterator[str]:
    gone = threading.Event()

    def current() -> Run:
        if gone.is_set():      # the client left while this thread waited for lines: end it here
            platform.close()
            raise _Disconnected
        return platform.get_run(name)

    lines = logs.follow(current, platform.secrets.redactor(), rank, resumption, follow=True)
    try:
        while (line := await anyio.to_thread.run_sync(next, lines, None, abandon_on_cancel=True)) is not None:
            yield _event(line)
        status = (await anyio.to_thread.run_sync(current)).status
    except RunNotFound:
        status = "DELETED"
    finally:
        gone.set()
        if not lines.gi_running:   # else the thread still reading closes it at its next poll
            platform.close()
    yield f"event: end\ndata: {status}\n\n"


def _event(line: str) -> str:
    """One SSE event; of a line rewritten with carriage returns (a progress bar) the last state is kept,
    as a terminal shows it (a bare CR would end the SSE line)."""
    return f"data: {line.rstrip(chr(13)).rsplit(chr(13), 1)[-1]}\n\n"


@router.get("/{name}/metrics")
def run_metrics(name: RunName, platform: TeamPlatform,
                after: Annotated[int, Query(ge=0, description="`next` of the previous answer.")] = 0
                ) -> dict[str, Any]:
    rows, offset = platform.run_metrics(name, after)
    return {"rows": rows, "next": offset}


@router.get("/{name}/events")
def run_events(name: RunName, platform: TeamPlatform,
               after: Annotated[int, Query(ge=0, description="How many events the caller has seen.")] = 0
               ) -> dict[str, Any]:
    run = platform.describe_run(name)
    return {"events": run["events"][after:], "resumptions": run["resumptions"]}
