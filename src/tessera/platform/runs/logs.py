"""Reading a run's logs: which node's log holds a rank's lines, and following those logs as they grow and on
into later resumptions.

Each node of a resumption writes `node-R.log` on the host that runs it; its supervisor ships the new
bytes to a chain of chunks in the artifacts store (shipping.py, chunks.py), and this module reads the
chains, so any replica serves the logs of a run another one supervises. With several ranks per node
torchrun prefixes each line `[defaultL]:`, which is how one rank's lines are picked out. Following keeps
the next chunk to read per log and holds back a line until its newline arrives, so a line is never split
between two reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from tessera.platform.errors import RunNotFound
from tessera.platform.runs.artifacts import ArtifactStore
from tessera.platform.runs.chunks import Chain
from tessera.platform.runs.info import Resumption, Run
from tessera.platform.secrets.redaction import Redactor

LogFile = tuple[int, Chain, str | None]   # (node rank, its log's chain, torchrun prefix to keep or None)
READ_LIMIT = 8 << 20                      # bytes of chunks read per log and round


def log_files(artifacts: ArtifactStore, run: Run, rank: int | None = None, resumption: int | None = None
              ) -> tuple[Resumption | None, list[LogFile]]:
    """The resumption (default: the newest; None when the run has none yet) and the logs to read."""
    if not run.resumptions:
        return None, []
    if resumption is None:
        res = run.resumptions[-1]
    else:
        matches = [r for r in run.resumptions if r.index == resumption]
        if not matches:
            raise RunNotFound(f"run {run.name} has no resumption {resumption} (it has "
                              f"0..{run.resumptions[-1].index})")
        res = matches[0]
    per_node = run.spec.compute.ranks_per_node
    nodes = range(run.spec.compute.nodes)
    if rank is None:
        return res, [(n, artifacts.log_chain(run.id, res.index, n), None) for n in nodes]
    world = run.spec.compute.nodes * per_node
    if not 0 <= rank < world:
        raise RunNotFound(f"run {run.name} has ranks 0..{world - 1}; there is no rank {rank}")
    prefix = f"[default{rank % per_node}]:" if per_node > 1 else None
    node = rank // per_node
    return res, [(node, artifacts.log_chain(run.id, res.index, node), prefix)]


def follow(artifacts: ArtifactStore, get_run: Callable[[], Run], redact: Redactor, rank: int | None = None,
           resumption: int | None = None, follow: bool = True, poll: float = 0.25) -> Iterator[str]:
    """Lines of the logs of the run `get_run` reads afresh on every round, passed through `redact`.
    With several nodes and no rank, each line starts with "[node R] ". Following continues into later
    resumptions until the run ends."""
    readers: dict[str, _Reader] = {}
    current = resumption
    while True:
        run = get_run()
        res, files = log_files(artifacts, run, rank, current)
        if res is None:
            if not follow or run.done:
                return
            time.sleep(poll)
            continue
        current = res.index
        ended = res.end is not None       # read before the logs: the last chunk is shipped before the end
        label = len(files) > 1
        more = False
        for node, chain, prefix in files:
            reader = readers.setdefault(chain.prefix, _Reader(chain))
            lines, behind = reader.lines(final=ended or not follow)
            more = more or behind
            for line in lines:
                if not prefix or line.startswith(prefix):
                    yield redact(f"[node {node}] {line}" if label else line)
        if more:
            continue                      # a page of a long log: read the next at once
        if not follow or (ended and resumption is not None):
            return
        if ended and run.resumptions[-1].index > res.index:
            current = res.index + 1
            continue
        if ended and run.done:
            return
        time.sleep(poll)


class _Reader:
    """One log's position: the next chunk, and the start of a line whose newline has not come yet."""

    def __init__(self, chain: Chain) -> None:
        self.chain, self.next, self.pending = chain, 0, b""

    def lines(self, final: bool) -> tuple[list[str], bool]:
        """(the complete lines of the chunks shipped since the last call, and the held-back line too if
        `final`; whether more chunks wait beyond this page)."""
        chunks, behind = self.chain.read(self.next, READ_LIMIT)
        self.next += len(chunks)
        data = self.pending + b"".join(c.payload for c in chunks)
        parts = data.split(b"\n")
        self.pending = parts.pop()
        if final and not behind and self.pending:
            parts.append(self.pending)
            self.pending = b""
        return [p.decode("utf-8", errors="replace") for p in parts], behind
