"""The API's bodies as pydantic models: what a request may send (with the bounds it may ask for) and what
every answer holds. The routes declare them (so the OpenAPI document types every request and every 2xx
answer with named properties), the in-process `Platform` returns the pages, and `RemotePlatform` reads
the answers through them: one definition of the wire format, on both sides. What the platform already
describes as a dataclass (a run's `Resumption` and `Event`, an `AuditRecord`) is used as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tessera.platform.runs.info import Event, Resumption
from tessera.platform.spec.run_spec import MAX_GPUS_PER_NODE, MAX_RETRIES, RunSpec
from tessera.platform.spec.schema import NAME_MAX, validate_name
from tessera.platform.store.audit import AuditRecord

# A name's bound is checked by validate_name, whose one-line error names the value and the bound (a
# max_length here would answer first, without the value); the schema still shows it.
NAMED: dict[str, Any] = {"json_schema_extra": {"maxLength": NAME_MAX}}
MAX_PAGE = 1000   # items per page, at most
PAGE = 50         # items per page unless asked


def _named(what: str) -> Callable[[str | None], str | None]:
    def check(value: str | None) -> str | None:
        return None if value is None else validate_name(value, what)
    return check


# --- requests --------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitRun(_Body):
    spec: dict[str, Any] = Field(description="A Tessera run spec, or an MCLI run YAML, as a mapping.")
    cluster: str | None = Field(None, **NAMED)

    _cluster = field_validator("cluster")(_named("cluster name"))


class ClusterChoice(_Body):
    cluster: str | None = Field(None, **NAMED)

    _cluster = field_validator("cluster")(_named("cluster name"))


class MoveRun(_Body):
    cluster: str = Field(**NAMED)

    _cluster = field_validator("cluster")(_named("cluster name"))


class CloneRun(_Body):
    name: str = Field(**NAMED)
    cluster: str | None = Field(None, **NAMED)
    gpus: int | None = Field(None, ge=0, le=MAX_GPUS_PER_NODE)

    _name = field_validator("name")(_named("run name"))
    _cluster = field_validator("cluster")(_named("cluster name"))


class UpdateRun(_Body):
    priority: Literal["low", "normal", "high"] | None = None
    max_duration: float | str | None = Field(None, description="Seconds, or a duration such as '12h'.")
    max_retries: int | None = Field(None, ge=0, le=MAX_RETRIES)
    preemptible: bool | None = Field(None, description="May be stopped for other work; applies from the run's "
                                                       "next submission.")
    retry_on_system_failure: bool | None = Field(None, description="Retry node faults and preemptions without "
                                                                   "counting them against max_retries.")

    @field_validator("max_duration")
    @classmethod
    def _short(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, str) and len(value) > 32:
            raise ValueError("a duration is at most 32 characters (e.g. '12h', '1h30m')")
        return value


class NewCluster(BaseModel):
    """`{"name", "type", "replace"?, "config"?: {...}}`; other keys are the cluster's config too, as the
    CLI's options are."""
    model_config = ConfigDict(extra="allow")
    name: str = Field(**NAMED)
    type: str = Field(max_length=32)
    replace: bool = False
    config: dict[str, Any] = Field(default_factory=dict)

    _cluster = field_validator("name")(_named("cluster name"))

    def settings(self) -> dict[str, Any]:
        return {**(self.model_extra or {}), **self.config}


class NewSecret(BaseModel):
    """`{"type", "name", "overwrite"?, ...the type's fields}`; a file's bytes come base64 in "content"."""
    model_config = ConfigDict(extra="allow")
    type: str = Field(max_length=32)
    name: str = Field(**NAMED)
    overwrite: bool = False

    _secret = field_validator("name")(_named("secret name"))


class NewUser(_Body):
    name: str = Field(**NAMED)
    team: str = Field(**NAMED)
    admin: bool = False

    _name = field_validator("name")(_named("user name"))
    _team = field_validator("team")(_named("team name"))


class NewTeam(_Body):
    name: str = Field(**NAMED)

    _team = field_validator("name")(_named("team name"))


# --- answers ---------------------------------------------------------------------------------------


class Health(BaseModel):
    ok: bool
    version: str
    replica: str | None = Field(None, description="The replica (server process) that answered.")


class WhoAmI(BaseModel):
    user: str
    team: str
    admin: bool


class RunSummary(BaseModel):
    """A row of the runs list (CLI, API, console), in `Run.summary()`'s order."""
    name: str
    id: str
    status: str
    cluster: str
    user: str | None
    gpus: int
    nodes: int
    created: float
    updated: float
    ended: float | None
    resumptions: int = Field(description="How many times the run started.")


class RunPage(BaseModel):
    """A page of runs, newest first. `next_cursor` asks for the page after this one (None: this is the
    last); runs submitted meanwhile come before the first page, so paging on never repeats or skips one."""
    items: list[RunSummary]
    next_cursor: str | None
    total: int = Field(description="How many runs match the filters (all pages).")


class RunDetail(BaseModel):
    """Everything `run describe` shows (`Run.to_dict()`); a newer server's further keys pass through."""
    model_config = ConfigDict(extra="allow")
    id: str
    name: str
    status: str
    cluster: str
    user: str | None
    created: float
    updated: float
    ended: float | None
    folder: str
    first_error: str | None
    failure_kind: str | None
    retries_used: int
    request: str | None
    spec: RunSpec
    resumptions: list[Resumption]
    events: list[Event]
    deleted: float | None = Field(None, description="When the run was deleted through MCLI's API (which keeps "
                                                    "the record); null for every run this API shows.")


class EventPage(BaseModel):
    """A run's events, oldest first, and its resumptions as they are now. `next_cursor` asks for the events
    after these; it is given even on the last page (the run may record more), None only before any."""
    items: list[Event]
    next_cursor: str | None
    resumptions: list[Resumption]


class Metrics(BaseModel):
    rows: list[dict[str, Any]] = Field(description="Rows the run reported (JSON objects), secret values masked.")
    next: int = Field(description="Pass as `after` to get the rows reported since.")


class AuditPage(BaseModel):
    """A page of the audit log, newest first; `next_cursor` as in RunPage."""
    items: list[AuditRecord]
    next_cursor: str | None


class ClusterInfo(BaseModel):
    """A cluster and its settings (partition, namespace, ...: the type's own keys, beside these); the
    built-in local cluster says `"builtin": true`."""
    model_config = ConfigDict(extra="allow")
    name: str
    type: str


class ClusterList(BaseModel):
    clusters: list[ClusterInfo]


class NodeState(BaseModel):
    name: str
    state: str
    healthy: bool
    reason: str | None
    excluded: bool
    faults: int
    cpus: int | None
    gpus: int | None
    gpu_type: str | None


class ClusterDetail(ClusterInfo):
    nodes: list[NodeState] | str = Field(description="The scheduler's nodes, or why they are unavailable.")
    excluded_nodes: list[str]
    active_runs: list[str]


class NodeCleared(BaseModel):
    cluster: str
    node: str
    cleared: bool = Field(description="False when the node had no faults.")


class SecretSummary(BaseModel):
    """What `secret list` shows: never a value."""
    name: str
    type: str
    created: float
    exposes: list[str] = Field(description="The variables (or file) it gives a run, not their values.")


class SecretList(BaseModel):
    secrets: list[SecretSummary]


class TeamMade(BaseModel):
    name: str


class UserMade(BaseModel):
    name: str
    team: str
    admin: bool
    api_key: str = Field(description="Shown this once.")


class KeyMade(BaseModel):
    name: str
    api_key: str = Field(description="Shown this once.")


class UserInfo(BaseModel):
    name: str
    team: str
    admin: bool
    created: float
    keys: list[str] = Field(description="Prefixes of the user's keys that are not revoked.")


class UserList(BaseModel):
    users: list[UserInfo]
    teams: list[str]


class ProblemDetails(BaseModel):
    """An error (RFC 9457, application/problem+json): `code` is stable, one per kind of error."""
    type: str
    title: str
    status: int
    detail: str
    code: str
