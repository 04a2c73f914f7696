"""The Python SDK: everything `tessera run|cluster|secret` does, as functions.

    from tessera.platform import create_run, wait_for_run_status, follow_logs
    run = create_run("run.yaml")                       # a path, a YAML string, a dict or a RunSpec
    wait_for_run_status(run.name, "RUNNING")
    for line in follow_logs(run.name):
        print(line)

Every function takes `home=` (default: $TESSERA_HOME or ~/.tessera). Actions that need watching (create,
stop, move, restart) start the supervisor if it is not running; it keeps going after this process exits.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tessera.platform.clusters import CLUSTER_TYPES, LOCAL, ClusterBackend, NodeInfo, make_backend
from tessera.platform.errors import ClusterError, RunFailed, RunNotFound, RunStateError, SpecError
from tessera.platform.home import tessera_home
from tessera.platform.secrets import SecretStore
from tessera.platform.spec import RunSpec, load_spec, parse_spec, validate_name, validate_spec
from tessera.platform.state import (
    ACTIVE,
    ALL_STATUSES,
    PENDING,
    TERMINAL,
    EventRecord,
    ResumptionRecord,
    RunRecord,
    StateDB,
    new_run_id,
)
from tessera.platform.supervisor import cluster_backend, ensure_supervisor

_ORDER = {status: i for i, status in enumerate(("PENDING", "QUEUED", "STARTING", "RUNNING", "STOPPING"))}


@dataclass
class Resumption:
    """One start of a run: where, on which nodes, when, why it started and how it ended."""
    index: int
    cluster: str
    cause: str
    status: str
    job_id: str | None
    nodes: list[str]
    submitted: float
    start: float | None
    end: float | None
    exit_code: int | None
    outcome: str | None
    detail: str | None
    folder: str
    last_heartbeat: dict[str, Any] | None

    @classmethod
    def from_record(cls, r: ResumptionRecord) -> Resumption:
        return cls(r.idx, r.cluster, r.cause, r.status, r.job_id, r.nodes, r.submitted, r.start, r.end,
                   r.exit_code, r.outcome, r.detail, r.folder, r.last_beat)


@dataclass
class Event:
    time: float
    kind: str
    message: str

    @classmethod
    def from_record(cls, e: EventRecord) -> Event:
        return cls(e.time, e.kind, e.message)


@dataclass
class Run:
    id: str
    name: str
    status: str
    cluster: str
    spec: RunSpec
    created: float
    updated: float
    ended: float | None
    folder: str
    first_error: str | None = None
    failure_kind: str | None = None
    retries_used: int = 0
    request: str | None = None
    resumptions: list[Resumption] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (the spec names secrets; values are never here)."""
        return {"id": self.id, "name": self.name, "status": self.status, "cluster": self.cluster,
                "created": self.created, "updated": self.updated, "ended": self.ended, "folder": self.folder,
                "first_error": self.first_error, "failure_kind": self.failure_kind,
                "retries_used": self.retries_used, "request": self.request,
                "spec": self.spec.model_dump(mode="json"),
                "resumptions": [r.__dict__ for r in self.resumptions],
                "events": [e.__dict__ for e in self.events]}


class Platform:
    """The platform of one TESSERA_HOME."""

    def __init__(self, home: str | Path | None = None) -> None:
        self.home = tessera_home(home)
        self.db = StateDB(self.home)
        self.secrets = SecretStore(self.home)

    def close(self) -> None:
        self.db.close()

    # --- clusters ---------------------------------------------------------------------------------

    def add_cluster(self, name: str, type_: str, *, replace: bool = False, **config: Any) -> dict[str, Any]:
        validate_name(name, "cluster name")
        if type_ not in CLUSTER_TYPES:
            raise ClusterError(f"unknown cluster type {type_!r}; use one of {', '.join(CLUSTER_TYPES)}")
        if not replace and self.db.get_cluster(name):
            raise ClusterError(f"cluster {name!r} exists; remove it first (tessera cluster remove {name})")
        config = {k: v for k, v in config.items() if v not in (None, "", [], {})}
        make_backend(name, type_, config)   # fails early on a bad config or a missing client library
        self.db.add_cluster(name, type_, config, replace=replace)
        return {"name": name, "type": type_, **config}

    def list_clusters(self) -> list[dict[str, Any]]:
        records = {c.name: {"name": c.name, "type": c.type, **c.config} for c in self.db.list_clusters()}
        records.setdefault(LOCAL, {"name": LOCAL, "type": "local", "builtin": True})
        return [records[name] for name in sorted(records)]

    def backend(self, name: str) -> ClusterBackend:
        return cluster_backend(self.db, name)

    def describe_cluster(self, name: str) -> dict[str, Any]:
        backend = self.backend(name)
        out: dict[str, Any] = backend.describe()
        try:
            nodes: list[NodeInfo] | str = backend.nodes()
        except ClusterError as exc:
            nodes = f"unavailable: {exc}"
        excluded = set(self.db.excluded_nodes(name))
        faults = {f["node"]: f for f in self.db.node_faults(name)}
        if isinstance(nodes, list):
            out["nodes"] = [{"name": n.name, "state": n.state, "healthy": n.healthy, "reason": n.reason,
                             "excluded": n.name in excluded, "faults": faults.get(n.name, {}).get("faults", 0)}
                            for n in nodes]
        else:
            out["nodes"] = nodes
        out["excluded_nodes"] = sorted(excluded)
        out["active_runs"] = [r.name for r in self.db.list_runs(ACTIVE, cluster=name)]
        return out

    def remove_cluster(self, name: str) -> None:
        active = self.db.list_runs(ACTIVE, cluster=name)
        if active:
            raise ClusterError(f"cluster {name!r} has active runs ({', '.join(r.name for r in active)}); "
                               "stop or move them first")
        if not self.db.remove_cluster(name):
            raise ClusterError(f"cluster {name!r} is not known")

    def clear_node(self, cluster: str, node: str) -> bool:
        """Forget a node's faults, so it is used again."""
        return self.db.clear_node(cluster, node)

    # --- runs -------------------------------------------------------------------------------------

    def create_run(self, spec: RunSpec | dict[str, Any] | str | Path, *, cluster: str | None = None,
                   workdir: str | Path | None = None, supervise: bool = True) -> Run:
        """Validate and submit a run; the supervisor starts it."""
        spec = _as_spec(spec)
        cluster = cluster or spec.compute.cluster or LOCAL
        spec = spec.model_copy(update={"compute": spec.compute.model_copy(update={"cluster": cluster})})
        backend = self.backend(cluster)
        backend.check(spec)
        missing = [s for s in spec.secrets if s not in {i.name for i in self.secrets.list()}]
        if missing:
            raise SpecError(f"run {spec.name!r} names secret(s) that do not exist: {', '.join(missing)} "
                            f"(create them with `tessera secret create ...`)")
        existing = self.db.get_run(spec.name)
        if existing:
            raise SpecError(f"a run named {spec.name!r} exists ({existing.status}); choose another name, or "
                            f"`tessera run restart {spec.name}`")
        folder = self.home / "runs" / spec.name
        if folder.exists():
            shutil.rmtree(folder)   # left by a run that was deleted from the database
        folder.mkdir(parents=True)
        (folder / "spec.yaml").write_text(spec.to_yaml(), encoding="utf-8")
        (folder / "parameters.yaml").write_text(yaml.safe_dump(spec.parameters, sort_keys=False),
                                                encoding="utf-8")
        now = time.time()
        record = RunRecord(new_run_id(), spec.name, spec.model_dump(mode="json"), PENDING, cluster, now, now,
                           str(folder), workdir=str(Path(workdir or Path.cwd()).resolve()),
                           next_cause="submitted")
        self.db.insert_run(record)
        self.db.add_event(record.id, "created", f"run created for cluster {cluster}")
        if supervise:
            ensure_supervisor(self.home)
        return self.get_run(record.id)

    def _record(self, name: str) -> RunRecord:
        record = self.db.get_run(name)
        if record is None:
            raise RunNotFound(f"no run named {name!r} (see `tessera run list`)")
        return record

    def get_run(self, name: str) -> Run:
        r = self._record(name)
        return Run(r.id, r.name, r.status, r.cluster, RunSpec.model_validate(r.spec), r.created, r.updated,
                   r.ended, r.folder, r.first_error, r.failure_kind, r.retries_used, r.request,
                   [Resumption.from_record(x) for x in self.db.resumptions(r.id)],
                   [Event.from_record(e) for e in self.db.events(r.id)])

    def list_runs(self, status: str | Iterable[str] | None = None, cluster: str | None = None,
                  limit: int | None = None) -> list[Run]:
        statuses = _statuses(status)
        return [self.get_run(r.id) for r in self.db.list_runs(statuses, cluster=cluster, limit=limit)]

    def wait_for_run_status(self, name: str, status: str | Iterable[str], timeout: float | None = None,
                            poll: float = 0.25) -> Run:
        """Wait until the run reaches `status`, or passes it: waiting for an active status (e.g. RUNNING)
        returns once the run is there or further along, finished included. Waiting for terminal statuses
        raises RunFailed if the run ends in another one; TimeoutError after `timeout` seconds."""
        wanted = set(_statuses(status) or ())
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.get_run(name)
            if run.status in wanted:
                return run
            active_wanted = [w for w in wanted if w in _ORDER]
            if active_wanted and (run.done or (run.status in _ORDER and
                                               any(_ORDER[run.status] > _ORDER[w] for w in active_wanted))):
                return run
            if run.done:
                detail = f": {run.first_error}" if run.first_error else ""
                raise RunFailed(f"run {name} ended {run.status}{detail} (waited for {'/'.join(sorted(wanted))})",
                                run)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {name} is {run.status} after {timeout} s (waited for "
                                   f"{'/'.join(sorted(wanted))})")
            time.sleep(poll)

    def _request(self, name: str, request: str, arg: str | None = None) -> Run:
        record = self._record(name)
        self.db.request(record.id, request, arg)
        self.db.add_event(record.id, "request", f"{request} requested" + (f" ({arg})" if arg else ""))
        ensure_supervisor(self.home)
        return self.get_run(record.id)

    def stop_run(self, name: str) -> Run:
        """Stop gracefully: SIGTERM, the run's stop_grace, then SIGKILL. A no-op for a finished run."""
        record = self._record(name)
        if record.status in TERMINAL:
            return self.get_run(name)
        return self._request(name, "stop")

    def move_run(self, name: str, cluster: str) -> Run:
        """Stop the run (it checkpoints on SIGTERM) and resume it on `cluster`."""
        record = self._record(name)
        spec = RunSpec.model_validate(record.spec)
        self.backend(cluster).check(spec)
        if record.status in TERMINAL:
            raise RunStateError(f"run {name} is {record.status}; use `tessera run restart {name} --cluster "
                                f"{cluster}` to start it again elsewhere")
        if cluster == record.cluster:
            raise RunStateError(f"run {name} is already on cluster {cluster}")
        return self._request(name, "move", cluster)

    def restart_run(self, name: str, cluster: str | None = None) -> Run:
        """Start a finished run again (a new resumption), or stop and start an active one."""
        record = self._record(name)
        if cluster:
            self.backend(cluster).check(RunSpec.model_validate(record.spec))
        if record.status in TERMINAL:
            self.db.update_run(record.id, status=PENDING, ended=None, first_error=None, failure_kind=None,
                               retries_used=0, system_retries=0, request=None, request_arg=None,
                               not_before=None, cluster=cluster or record.cluster,
                               next_cause="restarted on request")
            self.db.add_event(record.id, "restart", "restart requested")
            ensure_supervisor(self.home)
            return self.get_run(name)
        if cluster and cluster != record.cluster:
            return self._request(name, "move", cluster)
        return self._request(name, "restart")

    # --- logs -------------------------------------------------------------------------------------

    def log_files(self, name: str, rank: int | None = None, resumption: int | None = None
                  ) -> tuple[Run, Resumption | None, list[tuple[int, Path, str | None]]]:
        """(run, resumption, [(node rank, log file, torchrun prefix to keep or None)])."""
        run = self.get_run(name)
        if not run.resumptions:
            return run, None, []
        if resumption is None:
            res = run.resumptions[-1]
        else:
            matches = [r for r in run.resumptions if r.index == resumption]
            if not matches:
                raise RunNotFound(f"run {name} has no resumption {resumption} (it has "
                                  f"0..{run.resumptions[-1].index})")
            res = matches[0]
        per_node = run.spec.compute.ranks_per_node
        nodes = range(run.spec.compute.nodes)
        folder = Path(res.folder)
        if rank is None:
            return run, res, [(n, folder / f"node-{n}.log", None) for n in nodes]
        world = run.spec.compute.nodes * per_node
        if not 0 <= rank < world:
            raise RunNotFound(f"run {name} has ranks 0..{world - 1}; there is no rank {rank}")
        prefix = f"[default{rank % per_node}]:" if per_node > 1 else None
        return run, res, [(rank // per_node, folder / f"node-{rank // per_node}.log", prefix)]

    def follow_logs(self, name: str, rank: int | None = None, resumption: int | None = None,
                    follow: bool = True, poll: float = 0.25) -> Iterator[str]:
        """Lines of the run's logs (secret values replaced by ****). With several nodes and no rank, each
        line starts with "[node R] ". Following continues into later resumptions until the run ends."""
        redact = self.secrets.redactor()
        offsets: dict[Path, int] = {}
        pending: dict[Path, bytes] = {}
        current = resumption
        while True:
            run, res, files = self.log_files(name, rank, current)
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

    def describe_run(self, name: str) -> dict[str, Any]:
        """Everything `run describe` shows; passes through the redactor as a last guard."""
        redact = self.secrets.redactor()
        return json.loads(redact(json.dumps(self.get_run(name).to_dict())))


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


def _statuses(status: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if status is None:
        return None
    values = (status,) if isinstance(status, str) else tuple(status)
    out = tuple(v.upper() for v in values)
    for v in out:
        if v not in ALL_STATUSES:
            raise ValueError(f"unknown run status {v!r}; use one of {', '.join(ALL_STATUSES)}")
    return out


def _as_spec(spec: RunSpec | dict[str, Any] | str | Path) -> RunSpec:
    if isinstance(spec, RunSpec):
        return spec
    if isinstance(spec, dict):
        return validate_spec(spec)
    if isinstance(spec, Path) or (isinstance(spec, str) and "\n" not in spec and Path(spec).suffix in
                                  (".yaml", ".yml", ".json")):
        return load_spec(spec)
    return parse_spec(spec)


# --- module-level functions (the MCLI-style SDK) ---------------------------------------------------


def _platform(home: str | Path | None) -> Platform:
    return Platform(home)


def create_run(spec: RunSpec | dict[str, Any] | str | Path, *, cluster: str | None = None,
               home: str | Path | None = None, workdir: str | Path | None = None) -> Run:
    return _platform(home).create_run(spec, cluster=cluster, workdir=workdir)


def get_run(name: str, *, home: str | Path | None = None) -> Run:
    return _platform(home).get_run(name)


def list_runs(status: str | Iterable[str] | None = None, *, cluster: str | None = None,
              home: str | Path | None = None) -> list[Run]:
    return _platform(home).list_runs(status, cluster)


def wait_for_run_status(name: str, status: str | Iterable[str], timeout: float | None = None, *,
                        home: str | Path | None = None) -> Run:
    return _platform(home).wait_for_run_status(name, status, timeout)


def follow_logs(name: str, *, rank: int | None = None, resumption: int | None = None, follow: bool = True,
                home: str | Path | None = None) -> Iterator[str]:
    return _platform(home).follow_logs(name, rank, resumption, follow)


def stop_run(name: str, *, home: str | Path | None = None) -> Run:
    return _platform(home).stop_run(name)


def move_run(name: str, cluster: str, *, home: str | Path | None = None) -> Run:
    return _platform(home).move_run(name, cluster)


def restart_run(name: str, *, cluster: str | None = None, home: str | Path | None = None) -> Run:
    return _platform(home).restart_run(name, cluster)
