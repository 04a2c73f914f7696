"""Reading a run's logs: which node's file holds a rank's lines, and following those files as they grow
and on into later resumptions.

Logs are plain files in each resumption's folder (`node-R.log`), written by the run's processes; with
several ranks per node torchrun prefixes each line `[defaultL]:`, which is how one rank's lines are
picked out. Following keeps byte offsets per file and holds back a line until its newline arrives, so a
line is never split between two reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tessera.platform.errors import RunNotFound
from tessera.platform.runs.info import Resumption, Run
from tessera.platform.secrets.redaction import Redactor

LogFile = tuple[int, Path, str | None]   # (node rank, log file, torchrun prefix to keep or None)


def log_files(run: Run, rank: int | None = None, resumption: int | None = None
              ) -> tuple[Resumption | None, list[LogFile]]:
    """The resumption (default: the newest; None when the run has none yet) and the files to read."""
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
    folder = Path(res.folder)
    if rank is None:
        return res, [(n, folder / f"node-{n}.log", None) for n in nodes]
    world = run.spec.compute.nodes * per_node
    if not 0 <= rank < world:
        raise RunNotFound(f"run {run.name} has ranks 0..{world - 1}; there is no rank {rank}")
    prefix = f"[default{rank % per_node}]:" if per_node > 1 else None
    return res, [(rank // per_node, folder / f"node-{rank // per_node}.log", prefix)]


def follow(get_run: Callable[[], Run], redact: Redactor, rank: int | None = None,
                resumption: int | None = None, follow: bool = True, poll: float = 0.25) -> Iterator[str]:
    """Lines of the logs of the run `get_run` reads afresh on every round, passed through `redact`.
    With several nodes and no rank, each line starts with "[node R] ". Following continues into later
    resumptions until the run ends."""
    offsets: dict[Path, int] = {}
    pending: dict[Path, bytes] = {}
    current = resumption
    while True:
        run = get_run()
        res, files = log_files(run, rank, current)
        if res is None:
            if not follow or run.done:
                return
            time.sleep(poll)
            continue
        current = res.index
        ended = res.end is not None       # read before the files, so their ends are final
        label = len(files) > 1
        for node, path, prefix in files:
            for line in _new_lines(path, offsets, pending, final=ended or not follow):
                if not prefix or line.startswith(prefix):
                    yield redact(f"[node {node}] {line}" if label else line)
        if not follow or (ended and resumption is not None):
            return
        if ended and run.resumptions[-1].index > res.index:
            current = res.index + 1
            continue
        if ended and run.done:
            return
        time.sleep(poll)


def _new_lines(path: Path, offsets: dict[Path, int], pending: dict[Path, bytes], final: bool) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(offsets.get(path, 0))
            data = f.read()
    except OSError:
        return []
    offsets[path] = offsets.get(path, 0) + len(data)
    data = pending.pop(path, b"") + data
    lines = data.split(b"\n")
    if lines and lines[-1] and not final:
        pending[path] = lines[-1]
    tail = lines[-1] if final else b""
    lines = lines[:-1] + ([tail] if tail else [])
    return [line.decode("utf-8", errors="replace") for line in lines]
