"""Shipping what runs write locally to the artifacts store, so every replica can read it while they run.

A run's processes append to files in a private folder on the host that runs them: `node-R.log` per node
and `metrics.jsonl` in each resumption's folder. Whoever supervises the run (a server replica's
supervision, or the standalone supervisor) calls `Shipper.ship_resumption` on every pass (about 0.5 s)
and once more with `final=True` when the resumption has ended, before its end is recorded: so a reader
that sees a resumption ended has already been able to read all of it.

While a resumption runs only complete lines are shipped (a line still being written waits for its newline,
as a follower would hold it back anyway), at most CHUNK_LIMIT bytes per chunk; the final ship takes
everything. Secret values are masked before bytes leave the host (`Redactor`, as every reader masks
again), so the store never holds a value a run printed. Metrics lines are masked as JSON (`Redactor.json`).

Where a chain stands is read from the chain itself (chunks.py), so a shipper that crashed after a chunk
was written but before it noted so, or a replica that takes a run over, goes on from the byte after the
last chunk: nothing is shipped twice, nothing is lost. `ends` only saves a LIST per pass.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tessera.platform.runs.artifacts import ArtifactStore
from tessera.platform.runs.chunks import Chain, ChainEnd
from tessera.platform.runs.info import Run
from tessera.platform.runs.metrics import METRICS_FILE
from tessera.platform.secrets.redaction import Redactor

CHUNK_LIMIT = 1 << 20     # local bytes per chunk
SHIP_EVERY = 0.25         # seconds between the loop's ships of live resumptions
LIVE_FOR = 30.0           # seconds a live resumption stays registered without a pass seeing it
REDACTOR_FOR = 30.0       # seconds a Redactor (all the team's secrets decrypted) is reused
MAX_CHUNKS = 64           # per file and pass while it runs: a burst of 64 MiB in one pass, more in the next


def mask_text(data: bytes, redact: Redactor) -> bytes:
    """Log bytes with secret values masked; bytes that are not UTF-8 pass through unchanged."""
    return redact(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def mask_metrics(data: bytes, redact: Redactor) -> bytes:
    """Metrics lines: a JSON object masked as the metrics reader masks it, any other line as text."""
    out = []
    for line in data.split(b"\n"):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        out.append(json.dumps(redact.json(row)).encode() if isinstance(row, dict) else mask_text(line, redact))
    return b"\n".join(out)


def _read(path: Path, start: int, final: bool) -> bytes:
    """Bytes from `start` (at most CHUNK_LIMIT); unless `final`, only up to the last newline, except a
    line longer than CHUNK_LIMIT, which goes in pieces."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(CHUNK_LIMIT)
    except OSError:      # not written yet (or gone with the host that ran it)
        return b""
    if final or len(data) == CHUNK_LIMIT and b"\n" not in data:
        return data
    return data[:data.rfind(b"\n") + 1]


@dataclass
class _Live:
    """A resumption whose processes run, as its supervisor's last pass saw it."""
    artifacts: ArtifactStore
    run_id: str
    resumption: int
    folder: Path
    logs: list[Path]
    redactor: Callable[[], Redactor]
    seen: float


class Shipper:
    """Ships the new bytes of local run files to their chains; one per supervising process and team.

    A supervision pass calls `ship_resumption` for each resumption it watches, which also registers it as
    live; between passes a `ShipLoop` calls `ship_live` every SHIP_EVERY seconds, so a line reaches the
    store within about that, however long a pass takes. The final ship unregisters it. A resumption no
    pass has seen for LIVE_FOR seconds (its run's lease went to another replica) is dropped. One lock
    orders the pass's ships and the loop's."""

    def __init__(self) -> None:
        self.ends: dict[str, ChainEnd] = {}    # chain prefix -> its end, as last written or read here
        self.live: dict[tuple[str, int], _Live] = {}
        self.lock = threading.Lock()
        self._redactor: tuple[float, Redactor] | None = None

    def ship_resumption(self, artifacts: ArtifactStore, run_id: str, resumption: int, folder: Path,
                        logs: list[Path], redactor: Callable[[], Redactor], final: bool = False) -> int:
        """Ship the resumption's node logs (`logs[R]` is node R's file) and metrics file; `final` once its
        processes have ended. Returns how many local bytes went out. `redactor` is called only if there
        is something to ship (and at most every REDACTOR_FOR seconds: the secrets a run could print were
        made before it started, and every reader masks again)."""
        live = _Live(artifacts, run_id, resumption, folder, logs, redactor, time.monotonic())
        with self.lock:
            if final:
                self.live.pop((run_id, resumption), None)
            else:
                self.live[(run_id, resumption)] = live
            return self._ship(live, final)

    def ship_live(self) -> int:
        """Ship what every live resumption wrote since the last ship (the loop between passes). One that
        fails does not stop the others; the first failure is raised once all were tried."""
        shipped, failure = 0, None
        with self.lock:
            now = time.monotonic()
            for key in [k for k, live in self.live.items() if now - live.seen > LIVE_FOR]:
                del self.live[key]
            for live in list(self.live.values()):
                try:
                    shipped += self._ship(live, False)
                except Exception as exc:   # noqa: BLE001 - raised below, after the others
                    failure = failure or exc
        if failure is not None:
            raise failure
        return shipped

    def _ship(self, live: _Live, final: bool) -> int:
        def redact() -> Redactor:
            now = time.monotonic()
            if self._redactor is None or now - self._redactor[0] > REDACTOR_FOR:
                self._redactor = (now, live.redactor())
            return self._redactor[1]

        artifacts, run_id, resumption = live.artifacts, live.run_id, live.resumption
        chains = [(artifacts.log_chain(run_id, resumption, node), path, mask_text)
                  for node, path in enumerate(live.logs)]
        chains.append((artifacts.metrics_chain(run_id), live.folder / METRICS_FILE, mask_metrics))
        shipped = 0
        for chain, path, mask in chains:
            shipped += self.ship(chain, resumption, path, lambda data, m=mask: m(data, redact()), final)
        if final:   # the resumption's chains are complete; the metrics chain is re-read by the next one
            for chain, _, _ in chains:
                self.ends.pop(chain.prefix, None)
        return shipped

    def ship(self, chain: Chain, resumption: int, path: Path, mask: Callable[[bytes], bytes],
             final: bool = False) -> int:
        """The new bytes of `path` (written by `resumption`) to `chain`; how many local bytes went out."""
        shipped, chunks = 0, 0
        while final or chunks < MAX_CHUNKS:   # the final ship takes everything: the end is recorded next
            chunks += 1
            at = self.ends.get(chain.prefix) or chain.end()
            if at.resumption > resumption:    # a later resumption's file ships to this chain now
                return shipped
            start = at.local if at.resumption == resumption else 0
            data = _read(path, start, final)
            if not data:
                self.ends[chain.prefix] = at
                return shipped
            if chain.append(at, resumption, start, start + len(data), mask(data)):
                self.ends[chain.prefix] = ChainEnd(at.seq + 1, resumption, start + len(data))
                shipped += len(data)
            else:             # another shipper wrote this seq: learn where the chain is now
                self.ends.pop(chain.prefix, None)
        return shipped


def ship_history(artifacts: ArtifactStore, run_id: str, run_folder: Path,
                 resumptions: list[tuple[int, Path, int]], redactor: Callable[[], Redactor]) -> int:
    """Ship what a run made before its home had an artifacts store left in its folders (a home being
    imported): each resumption's node logs ((index, folder, nodes) each), and the run's one metrics.jsonl
    of that time as its last resumption's, so a restart's metrics continue after it. Shipping again
    ships nothing: each chain knows what it holds."""
    shipper = Shipper()
    shipped = 0
    for index, folder, nodes in resumptions:
        logs = [folder / f"node-{node}.log" for node in range(nodes)]
        shipped += shipper.ship_resumption(artifacts, run_id, index, folder, logs, redactor, final=True)
    if resumptions:
        redact = redactor()
        shipped += shipper.ship(artifacts.metrics_chain(run_id), resumptions[-1][0], run_folder / METRICS_FILE,
                                lambda data: mask_metrics(data, redact), final=True)
    return shipped


_ADOPTED: set[str] = set()    # runs whose history this process has looked at already


def adopt_history(artifacts: ArtifactStore, run_id: str, get_run: Callable[[], Run],
                  redactor: Callable[[], Redactor]) -> int:
    """Before a run's logs or metrics are read: a run an older version made (its files only in its local
    folders: the run's metrics.jsonl, which only those wrote, or an ended resumption's node log while its
    chain is empty) has them shipped now, once (`ship_history`). Looked at once per run and process; a
    stat or two, and one LIST only for a run with such files on this host."""
    if run_id in _ADOPTED:
        return 0
    run = get_run()
    ended = [(r.index, Path(r.folder), run.spec.compute.nodes) for r in run.resumptions if r.end is not None]
    legacy = _size(Path(run.folder) / METRICS_FILE) or any(_size(folder / "node-0.log") for _, folder, _ in ended)
    shipped = 0
    if ended and legacy and next(artifacts.log_chain(run.id, ended[0][0], 0).listed(), None) is None:
        shipped = ship_history(artifacts, run.id, Path(run.folder), ended, redactor)
    _ADOPTED.add(run.id)
    return shipped


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class ShipLoop:
    """A thread that ships the live resumptions of `shippers()` every SHIP_EVERY seconds, between the
    supervision passes (a pass may take seconds: a cluster's queue, many runs); it ends with `stop`. A
    failure (the store unreachable) is reported once and tried again; the pass's own ship, before a
    resumption's end is recorded, is the one that must succeed."""

    def __init__(self, shippers: Callable[[], Iterable[Shipper]]) -> None:
        self.shippers = shippers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tessera-shipping", daemon=True)

    def start(self) -> ShipLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _loop(self) -> None:
        failed = ""
        while not self._stop.wait(SHIP_EVERY):
            try:
                for shipper in list(self.shippers()):
                    shipper.ship_live()
                failed = ""
            except Exception as exc:   # noqa: BLE001 - reported once, tried again at the next round
                message = f"{type(exc).__name__}: {exc}"
                if message != failed:
                    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} shipping run output failed (will retry): "
                          f"{message}", file=sys.stderr, flush=True)
                    failed = message
