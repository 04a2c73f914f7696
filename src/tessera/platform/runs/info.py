"""What the SDK returns about a run (`Platform.get_run`, `run describe`): `Run`, its `Resumption`s and
`Event`s. Plain dataclasses, made from the database rows of state.py, with the names users read
(`index`, `last_heartbeat`) rather than the columns' (`idx`, `last_beat`). `Run.to_dict()` is also the
wire format of the server's API, and `Run.from_dict()` rebuilds the same Run from it on the client."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tessera.platform.spec.run_spec import RunSpec
from tessera.platform.store.state import TERMINAL, EventRecord, ResumptionRecord, RunRecord


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
    user: str | None = None
    deleted: float | None = None     # when it was deleted (MCLI's deleteRuns keeps the record); None: it is not

    @classmethod
    def from_record(cls, r: RunRecord, resumptions: list[ResumptionRecord], events: list[EventRecord]) -> Run:
        return cls(r.id, r.name, r.status, r.cluster, RunSpec.model_validate(r.spec), r.created, r.updated,
                   r.ended, r.folder, r.first_error, r.failure_kind, r.retries_used, r.request,
                   [Resumption.from_record(x) for x in resumptions], [Event.from_record(e) for e in events],
                   r.user, r.deleted)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Run:
        """The Run that `to_dict()` described (keys it does not know, e.g. from a newer server, are ignored)."""
        known = {f.name for f in fields(cls)} - {"spec", "resumptions", "events"}
        return cls(**{k: v for k, v in d.items() if k in known}, spec=RunSpec.model_validate(d["spec"]),
                   resumptions=[_build(Resumption, r) for r in d.get("resumptions") or []],
                   events=[_build(Event, e) for e in d.get("events") or []])

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def summary(self) -> dict[str, Any]:
        """A row of the runs list (CLI, API, console): what a table shows, without spec, events and resumptions."""
        compute = self.spec.compute
        return {"name": self.name, "id": self.id, "status": self.status, "cluster": self.cluster,
                "user": self.user, "gpus": compute.gpus_per_node * compute.nodes, "nodes": compute.nodes,
                "created": self.created, "updated": self.updated, "ended": self.ended,
                "resumptions": len(self.resumptions)}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (the spec names secrets; values are never here)."""
        return {"id": self.id, "name": self.name, "status": self.status, "cluster": self.cluster,
                "user": self.user, "created": self.created, "updated": self.updated, "ended": self.ended, "folder": self.folder,
                "first_error": self.first_error, "failure_kind": self.failure_kind,
                "retries_used": self.retries_used, "request": self.request,
                "spec": self.spec.model_dump(mode="json"),
                "resumptions": [asdict(r) for r in self.resumptions],
                "events": [asdict(e) for e in self.events], "deleted": self.deleted}

    def describe(self, lease: tuple[str, float] | None, redact: Callable[[str], str]) -> dict[str, Any]:
        """`run describe`'s answer: `to_dict()` with the replica supervising the run (its `lease`: replica,
        expiry), passed through `redact` as a last guard."""
        described = self.to_dict()
        described["supervisor"] = {"replica": lease[0], "lease_expires": lease[1]} if lease else None
        return json.loads(redact(json.dumps(described)))


def _build(cls: type[Any], d: dict[str, Any]) -> Any:
    """A dataclass from a dict, ignoring keys it does not have."""
    return cls(**{f.name: d.get(f.name) for f in fields(cls)})
