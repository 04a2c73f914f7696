"""Which runs an MCLI operation means: its typed filters (names, statuses, clusters, GPUs, dates, users)
applied to the team's runs, a page at a time.

The filters the Platform's run list takes (statuses, one cluster, one user) are given to it, so the
database does that work; the rest is checked on each run's description. Pages follow the Platform's own
cursor: each page asked for is no larger than what is still needed, so the cursor handed back is exactly
the Platform's after the last run returned, and paging on never repeats or skips a run. Runs deleted
through this API are left out unless `includeDeleted` (they are then described by id: a deleted run may
share its name with a newer one).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tessera.platform.api.models import MAX_PAGE
from tessera.platform.api.sdk import Platform
from tessera.platform.errors import RunNotFound
from tessera.platform.server.graphql.inputs import DateFilter, EntityInput, RunFilters, StringFilter
from tessera.platform.server.graphql.views import tessera_statuses
from tessera.platform.spec.run_spec import RunSpec

DEFAULT_LIMIT = 100   # MCLI's own default


def _values(f: StringFilter | None) -> list[str] | None:
    return None if f is None or f.in_ is None else list(f.in_)


def _time(value: str | None, where: str) -> float | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not an ISO 8601 time") from None
    return (moment if moment.tzinfo else moment.astimezone()).timestamp()


def _window(f: DateFilter | None, where: str) -> tuple[float | None, float | None]:
    return (None, None) if f is None else (_time(f.gte, f"{where}.gte"), _time(f.lt, f"{where}.lt"))


def _inside(t: float | None, window: tuple[float | None, float | None]) -> bool:
    start, end = window
    if start is None and end is None:
        return True
    return t is not None and (start is None or t >= start) and (end is None or t < end)


@dataclass
class Selection:
    names: list[str] | None = None
    statuses: tuple[str, ...] | None = None
    clusters: list[str] | None = None
    gpu_types: list[str] | None = None
    gpu_nums: list[int] | None = None
    training: bool = True                      # runType filter: Tessera's runs are all TRAINING
    created: tuple[float | None, float | None] = (None, None)
    ended: tuple[float | None, float | None] = (None, None)
    users: list[str] | None = None
    deleted: bool = False                      # includeDeleted

    @classmethod
    def of(cls, filters: RunFilters | None, entity: EntityInput | None, caller: str,
           include_deleted: bool | None = None) -> Selection:
        """As MosaicML's API reads them: a list is the caller's own runs, unless the entity names users
        (`emails`: `mcli get runs --user`) or the organization (`--all-users`: the caller's team); runs
        asked for by name are found whoever submitted them (names are unique in a team)."""
        f = filters or RunFilters()
        statuses = _values(f.status)
        run_types = _values(f.run_type)
        if entity is not None and entity.emails:
            users: list[str] | None = list(entity.emails)
        elif (entity is not None and entity.organization_ids) or _values(f.name) is not None:
            users = None
        else:
            users = [caller]
        return cls(names=_values(f.name), statuses=None if statuses is None else tessera_statuses(statuses),
                   clusters=_values(f.cluster_name), gpu_types=[g.lower() for g in _values(f.gpu_type) or []] or None,
                   gpu_nums=None if f.gpu_num is None or f.gpu_num.in_ is None else list(f.gpu_num.in_),
                   training=run_types is None or "TRAINING" in {r.upper() for r in run_types},
                   created=_window(f.created_at, "createdAt"), ended=_window(f.ended_at, "endedAt"), users=users,
                   deleted=bool(include_deleted))

    @property
    def empty(self) -> bool:
        """Nothing can match (only UNKNOWN statuses, or only run types Tessera has not)."""
        return not self.training or self.statuses == () or self.names == []

    def matches(self, run: dict[str, Any]) -> bool:
        compute = RunSpec.model_validate(run["spec"]).compute
        return ((self.statuses is None or run["status"] in self.statuses)
                and (self.clusters is None or run["cluster"] in self.clusters)
                and (self.users is None or run["user"] in self.users)
                and (self.gpu_nums is None or compute.gpus_per_node * compute.nodes in self.gpu_nums)
                and (self.gpu_types is None or (compute.gpu_type or "none").lower() in self.gpu_types)
                and _inside(run["created"], self.created) and _inside(run["ended"], self.ended))


def _describe(platform: Platform, name: str, include_deleted: bool = False) -> dict[str, Any] | None:
    try:
        return platform.describe_run(name, include_deleted=include_deleted)
    except RunNotFound:    # deleted since it was listed
        return None


def _by_name(platform: Platform, name: str, include_deleted: bool) -> list[dict[str, Any]]:
    """The run of that name; with `include_deleted`, the deleted runs of that name too (the name is a
    substring search of the Platform's list, kept to the runs named exactly so)."""
    if not include_deleted:
        found = _describe(platform, name)
        return [found] if found else []
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = platform.run_page(q=name, cursor=cursor, limit=MAX_PAGE, include_deleted=True)
        out += platform.describe_runs([item.id for item in page.items if item.name == name], include_deleted=True)
        cursor = page.next_cursor
        if cursor is None:
            return out


def select_runs(platform: Platform, sel: Selection, limit: int | None = DEFAULT_LIMIT,
                cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """(the descriptions of up to `limit` matching runs, newest first; the cursor of the next page, or None)."""
    limit = max(1, min(limit or DEFAULT_LIMIT, MAX_PAGE))
    if sel.empty:
        return [], None
    if sel.names is not None:     # by name: each looked up, no paging
        found = [d for n in dict.fromkeys(sel.names) for d in _by_name(platform, n, sel.deleted) if sel.matches(d)]
        return sorted(found, key=lambda d: d["created"], reverse=True)[:limit], None
    cluster = sel.clusters[0] if sel.clusters is not None and len(sel.clusters) == 1 else None
    user = sel.users[0] if sel.users is not None and len(sel.users) == 1 else None
    out: list[dict[str, Any]] = []
    while True:
        page = platform.run_page(sel.statuses, cluster, user=user, cursor=cursor, limit=limit - len(out),
                                 include_deleted=sel.deleted)
        described = platform.describe_runs([item.id for item in page.items], include_deleted=sel.deleted)
        out += [d for d in described if sel.matches(d)]
        cursor = page.next_cursor
        if cursor is None or len(out) >= limit:
            return out, cursor


def named(platform: Platform, filters: RunFilters | None, verb: str) -> list[dict[str, Any]]:
    """The runs a stop, delete, update or start names (`filters.name.in`), each as described now; a
    name without a run is an error, as is a change without names (it would reach every run)."""
    names = _values(filters.name if filters else None)
    if not names:
        raise ValueError(f"{verb} needs filters.name.in: the names of the runs")
    return [platform.describe_run(name) for name in dict.fromkeys(names)]
