"""MCLI's subscriptions: `getRunLogsV2` (a run's log as base64 chunks, each with the byte offset where it
ends) and `watchRunStatus` (the run's status each time it changes, until it ends).

The log is the text `Platform.follow_logs` gives (secret values masked), one "\\n" after each line;
offsets count its UTF-8 bytes from the start. MCLI resumes a dropped subscription by sending the last
`endOffset` as `offset`, so offsets are absolute even with `tail` (the last N lines: the first chunk
starts where they start). Following reads through the server's one log follower (server/log_stream.py:
a thread of its own per follower, a bounded buffer), so a quiet run holds no worker thread.

MCLI's node and GPU ranks: `globalGpuRank` is Tessera's rank; `nodeRank` with `localGpuRank` the rank
`node * ranks_per_node + local`; `nodeRank` alone is that node's whole log. `failed` (the first failed
node) reads every node, each line labelled "[node R]" when there are several; `exceptionOnly` keeps the
first Python traceback.
"""

from __future__ import annotations

import asyncio
import base64
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from typing import Any

from graphql import GraphQLError
from strawberry.types import Info

from tessera.platform.api.sdk import Platform
from tessera.platform.errors import RunNotFound
from tessera.platform.runs.info import Run
from tessera.platform.server.graphql import types
from tessera.platform.server.graphql.context import Context, call, error
from tessera.platform.server.graphql.inputs import GetRunLogsInput, WatchRunStatusInput
from tessera.platform.server.graphql.views import mcli_status
from tessera.platform.server.log_stream import LogFeed
from tessera.platform.store.state import TERMINAL

Ctx = Info[Context, Any]
CHUNK = 64 * 1024     # bytes per message, about
BATCH = 2000          # lines read per hop to a worker thread
KEEPALIVE = 15.0      # seconds a follower waits for lines before looking again
POLL = 0.5            # seconds between status checks of watchRunStatus


class _Lines:
    """What the client asked for of a run's lines: one node's (labels removed), the first traceback."""

    def __init__(self, node: int | None, nodes: int, exception_only: bool) -> None:
        self.label = f"[node {node}] " if node is not None and nodes > 1 else None
        self.exception_only, self.state = exception_only, "before"

    def keep(self, lines: Iterable[str]) -> Iterator[str]:
        for line in lines:
            if self.label is not None:
                if not line.startswith(self.label):
                    continue
                line = line[len(self.label):]
            if not self.exception_only:
                yield line
            elif self.state == "before" and line.startswith("Traceback (most recent call last):"):
                self.state = "in"
                yield line
            elif self.state == "in":
                self.state = "in" if line[:1].isspace() or not line.strip() else "after"
                yield line


class _Chunker:
    """Lines to chunks from byte `start` of the log on, each with the offset where it ends."""

    def __init__(self, start: int) -> None:
        self.start, self.pos = start, 0

    def chunks(self, lines: Iterable[str]) -> Iterator[types.LogChunk]:
        out: list[bytes] = []
        size = 0
        for line in lines:
            data = (line + "\n").encode()
            skip = max(0, min(len(data), self.start - self.pos))
            self.pos += len(data)
            if skip < len(data):
                out.append(data[skip:])
                size += len(data) - skip
            if size >= CHUNK:
                yield self._chunk(out)
                out, size = [], 0
        if out:
            yield self._chunk(out)

    def _chunk(self, parts: list[bytes]) -> types.LogChunk:
        return types.LogChunk(chunk=base64.b64encode(b"".join(parts)).decode("ascii"), end_offset=self.pos)


def _ranks(run: Run, data: GetRunLogsInput) -> tuple[int | None, int | None]:
    """(Tessera's rank to read, or None; the node whose whole log to keep, or None)."""
    per_node = run.spec.compute.ranks_per_node
    if data.global_gpu_rank is not None:
        return data.global_gpu_rank, None
    if data.local_gpu_rank is not None:
        return (data.node_rank or 0) * per_node + data.local_gpu_rank, None
    if data.node_rank is not None:
        if not 0 <= data.node_rank < run.spec.compute.nodes:
            raise RunNotFound(f"run {run.name} has nodes 0..{run.spec.compute.nodes - 1}; there is no node "
                              f"{data.node_rank}")
        return None, data.node_rank
    return None, None


async def _batches(make: Callable[[], Iterator[str]]) -> AsyncGenerator[list[str], None]:
    """The lines of `make()` (a blocking iterator) read in a worker thread, a batch per hop."""
    lines = await call(make)
    while batch := await call(lambda: [line for _, line in zip(range(BATCH), lines, strict=False)]):
        yield batch


async def _start(platform: Platform, data: GetRunLogsInput, rank: int | None, keep: _Lines) -> int:
    """Where the client's text starts: its `offset`, else the start of the last `tail` lines, else 0."""
    if data.offset:
        return data.offset
    if data.tail is None:
        return 0
    total, last = 0, deque[int](maxlen=max(data.tail, 0) or None)
    async for batch in _batches(lambda: platform.follow_logs(data.name, rank, data.attempt_index, follow=False)):
        for line in keep.keep(batch):
            size = len((line + "\n").encode())
            total += size
            last.append(size)
    return total - (sum(last) if data.tail > 0 else 0)


async def _followed(ctx: Context, team: str, name: str, rank: int | None, resumption: int | None
                    ) -> AsyncGenerator[list[str], None]:
    feed = LogFeed(ctx.state.teams.open(team), name, rank, resumption)   # closes its platform when done
    try:
        while True:
            batch = await feed.take(KEEPALIVE)
            if batch is not None:
                lines, end = batch
                yield lines
                if end is not None:
                    return
    finally:
        feed.stop()


async def get_run_logs_v2(info: Ctx, get_run_logs_input: GetRunLogsInput) -> AsyncGenerator[types.LogChunk, None]:
    data, ctx = get_run_logs_input, info.context
    who = await ctx.who()
    if data.container_name not in (None, "MAIN"):
        raise error(f"container {data.container_name!r}: a Tessera run has one container, MAIN", 400, "value_invalid")
    platform = ctx.state.teams.open(who.team)
    try:
        run = await call(lambda: platform.get_run(data.name))
        rank, node = _ranks(run, data)
        keep = _Lines(node, run.spec.compute.nodes, bool(data.exception_only))
        chunker = _Chunker(await _start(platform, data, rank, _Lines(node, run.spec.compute.nodes, False)))
        if data.follow:
            lines = _followed(ctx, who.team, data.name, rank, data.attempt_index)
        else:
            lines = _batches(lambda: platform.follow_logs(data.name, rank, data.attempt_index, follow=False))
        async for batch in lines:
            for chunk in chunker.chunks(keep.keep(batch)):
                yield chunk
    except RunNotFound as exc:
        raise error(str(exc), 404, "run_not_found") from exc
    finally:
        platform.close()


async def watch_run_status(info: Ctx, watch_run_status_input: WatchRunStatusInput) -> AsyncGenerator[str, None]:
    """The run's MCLI status now, then each change, ending after a final status (or once it is deleted)."""
    ctx, name = info.context, watch_run_status_input.name
    who = await ctx.who()
    platform = ctx.state.teams.open(who.team)
    try:
        last = None
        while True:
            try:
                status = await call(lambda: platform.get_run(name).status)
            except GraphQLError:
                if last is None:
                    raise
                return       # deleted while watched
            if mcli_status(status) != last:
                last = mcli_status(status)
                yield last
            if status in TERMINAL:
                return
            await asyncio.sleep(POLL)
    finally:
        platform.close()
