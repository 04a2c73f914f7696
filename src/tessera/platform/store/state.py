"""The platform's state as one team sees it: `StateDB(engine, team)`, a view over the one store.

Every query is scoped to the team; every write is one transaction of the store (audit.transaction), so
the audit entry of the change being made, if any, commits with it. Uniqueness (a run's name, a
cluster's name per team) is the database's: a racing loser gets the platform's error (RunExists,
ClusterError), never a driver's. A view made for a supervisor carries its `fence` (leases.py): each of
its writes about a run first checks that the supervisor still holds the run's lease, and is refused
(StaleLease) once another replica has taken it over. Secret values are never written here: specs name
secrets, and every text that came from a run's logs is redacted before it is stored.

The standalone CLI's view is `StateDB.local(home)`: team "local" in `$TESSERA_HOME/store.db` (homes.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from tessera.platform.errors import ClusterError, RunExists
from tessera.platform.store.audit import transaction
from tessera.platform.store.db import reading
from tessera.platform.store.homes import LOCAL_TEAM, home_engine
from tessera.platform.store.leases import Fence
from tessera.platform.store.models import clusters, events, node_faults, resumptions, runs
from tessera.platform.store.paging import Page, check_limit, decode_cursor, encode_cursor
from tessera.platform.store.records import (
    ACTIVE,
    ALL_STATUSES,
    COMPLETED,
    FAILED,
    PENDING,
    QUEUED,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    SUBMITTING,
    TERMINAL,
    ClusterRecord,
    EventRecord,
    ResumptionRecord,
    RunRecord,
    columns,
    encode,
    from_row,
    new_run_id,
)

__all__ = ["ACTIVE", "ALL_STATUSES", "COMPLETED", "FAILED", "PENDING", "QUEUED", "RUNNING", "STARTING",
           "STOPPED", "STOPPING", "SUBMITTING", "TERMINAL", "ClusterRecord", "EventRecord", "ResumptionRecord",
           "RunRecord", "StateDB", "new_run_id"]


_CHUNK = 500   # run ids per IN (...) query


class _NothingDeleted(Exception):
    """Rolls back a DELETE that found nothing (StateDB._delete)."""


def _name_taken(exc: IntegrityError, table: str) -> bool:
    """Whether the refusal is the unique (team, name) of `table` (SQLite and PostgreSQL word it apart)."""
    text = str(exc.orig)
    return f"{table}.team, {table}.name" in text or f"uq_{table}_team_name" in text or f"{table}_pkey" in text


class StateDB:
    """One team's state; holds no connection (each call takes one from the engine's pool), so it may be
    made per request and shared by threads."""

    def __init__(self, engine: Engine, team: str, *, fence: Fence | None = None) -> None:
        self.engine = engine
        self.team = team
        self.fence = fence

    @classmethod
    def local(cls, home: str | Path | None = None) -> StateDB:
        """The standalone CLI's state: team "local" of `$TESSERA_HOME/store.db`."""
        return cls(home_engine(home), LOCAL_TEAM)

    def close(self) -> None:
        """Nothing to close (the engine is shared); kept so callers may use a view as a context manager."""

    def __enter__(self) -> StateDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def write(self, run_id: str | None = None) -> Iterator[Connection]:
        """A write transaction; with a fence, refused unless the lease of `run_id` is still ours."""
        with transaction(self.engine) as c:
            if self.fence is not None and run_id is not None:
                self.fence.check(c, run_id)
            yield c

    def fetch(self, query: Any) -> list[Any]:
        with reading(self.engine) as c:
            return list(c.execute(query).mappings())

    # --- clusters ---------------------------------------------------------------------------------

    def add_cluster(self, name: str, type_: str, config: dict[str, Any], replace: bool = False) -> None:
        """ClusterError if the name is taken and not `replace`d (the unique name decides a race)."""
        row = {"team": self.team, "name": name, "type": type_, "config": json.dumps(config), "created": time.time()}
        try:
            with self.write() as c:
                if replace:
                    c.execute(delete(clusters).where(clusters.c.team == self.team, clusters.c.name == name))
                c.execute(insert(clusters).values(**row))
        except IntegrityError:
            raise ClusterError(f"cluster {name!r} exists; remove it first (tessera cluster remove {name})") from None

    def get_cluster(self, name: str) -> ClusterRecord | None:
        rows = self.fetch(select(clusters).where(clusters.c.team == self.team, clusters.c.name == name))
        return from_row(ClusterRecord, rows[0]) if rows else None

    def list_clusters(self) -> list[ClusterRecord]:
        rows = self.fetch(select(clusters).where(clusters.c.team == self.team).order_by(clusters.c.name))
        return [from_row(ClusterRecord, r) for r in rows]

    def remove_cluster(self, name: str) -> bool:
        return self._delete(delete(clusters).where(clusters.c.team == self.team, clusters.c.name == name))

    def _delete(self, statement: Any, then: Callable[[], None] | None = None) -> bool:
        """Run a DELETE (and `then`, in its transaction); False, with the transaction rolled back, when it
        deleted nothing: the audit entry it carried goes with it (a refused change leaves none)."""
        try:
            with self.write() as c:
                if c.execute(statement).rowcount == 0:
                    raise _NothingDeleted
                if then:
                    then()
        except _NothingDeleted:
            return False
        return True

    # --- runs -------------------------------------------------------------------------------------

    def insert_run(self, run: RunRecord, *, event: str | None = None,
                   publish: Callable[[], None] | None = None) -> None:
        """Claim the run's name, then write its folder (`publish`) and its 'created' `event`, in one
        transaction.

        The INSERT comes first: the unique (team, name) decides between racing submissions before any of
        them touches a file (a second insert of the name waits for the first's transaction, then fails),
        and a loser raises RunExists having written nothing. If `publish` fails, or the process is
        killed before COMMIT, the claim is rolled back and the half-written folder belongs to no run (the
        next claimant of the name clears it)."""
        try:
            with self.write() as c:
                c.execute(insert(runs).values(team=self.team, **columns(run)))
                if event:
                    c.execute(insert(events).values(run_id=run.id, team=self.team, time=run.created,
                                                    kind="created", message=event))
                if publish:
                    publish()
        except IntegrityError as exc:   # another submission took the name since it was checked
            if not _name_taken(exc, "runs"):
                raise
            raise RunExists(f"a run named {run.name!r} exists; choose another name") from None

    def get_run(self, name_or_id: str, *, include_deleted: bool = False) -> RunRecord | None:
        """The run of that name (else id) that is not deleted; with `include_deleted`, a deleted one too
        (the one not deleted first, then the newest: deleted runs may share a name)."""
        query = select(runs).where(runs.c.team == self.team, (runs.c.name == name_or_id) | (runs.c.id == name_or_id))
        if not include_deleted:
            query = query.where(runs.c.deleted.is_(None))
        query = query.order_by((runs.c.name == name_or_id).desc(), runs.c.deleted.is_(None).desc(),
                               runs.c.created.desc()).limit(1)
        rows = self.fetch(query)
        return from_row(RunRecord, rows[0]) if rows else None

    def get_runs(self, run_ids: list[str]) -> list[RunRecord]:
        """The team's runs of these ids (those that still exist), oldest first."""
        found: list[RunRecord] = []
        for start in range(0, len(run_ids), _CHUNK):
            query = select(runs).where(runs.c.team == self.team, runs.c.id.in_(run_ids[start:start + _CHUNK]))
            found += [from_row(RunRecord, r) for r in self.fetch(query)]
        return sorted(found, key=lambda r: (r.created, r.id))

    def _filter(self, query: Any, statuses: tuple[str, ...] | None, cluster: str | None, user: str | None,
                q: str | None, include_deleted: bool) -> Any:
        """The team's runs filtered as `list_runs`, `page_runs` and `count_runs` filter them: deleted runs
        only with `include_deleted`."""
        query = query.where(runs.c.team == self.team)
        if not include_deleted:
            query = query.where(runs.c.deleted.is_(None))
        if statuses:
            query = query.where(runs.c.status.in_(statuses))
        if cluster:
            query = query.where(runs.c.cluster == cluster)
        if user:
            query = query.where(runs.c.user == user)
        if q:   # run names are lower case, so the search is too
            query = query.where(runs.c.name.contains(q.lower(), autoescape=True))
        return query

    def list_runs(self, statuses: tuple[str, ...] | None = None, cluster: str | None = None,
                  limit: int | None = None, *, user: str | None = None, offset: int = 0,
                  q: str | None = None) -> list[RunRecord]:
        """Runs newest first (not deleted); `q` keeps the names containing it."""
        query = self._filter(select(runs), statuses, cluster, user, q, False).order_by(runs.c.created.desc(), runs.c.id.desc())
        if limit:
            query = query.limit(int(limit))
        if offset:
            query = query.offset(int(offset))
        return [from_row(RunRecord, r) for r in self.fetch(query)]

    def page_runs(self, statuses: tuple[str, ...] | None = None, cluster: str | None = None, *,
                  user: str | None = None, q: str | None = None, cursor: str | None = None,
                  limit: int = 50, include_deleted: bool = False) -> Page[RunRecord]:
        """(a page of runs newest first, filtered as `list_runs`; the cursor of the next page or None).
        The cursor is the last run's (created, id): a page never shifts when runs are submitted meanwhile."""
        query = self._filter(select(runs), statuses, cluster, user, q, include_deleted)
        if cursor:
            created, run_id = decode_cursor(cursor, (float, str))
            query = query.where((runs.c.created < created) | ((runs.c.created == created) & (runs.c.id < run_id)))
        query = query.order_by(runs.c.created.desc(), runs.c.id.desc()).limit(check_limit(limit) + 1)
        records = [from_row(RunRecord, r) for r in self.fetch(query)]
        more = len(records) > limit
        records = records[:limit]
        return records, encode_cursor(records[-1].created, records[-1].id) if more else None

    def count_runs(self, statuses: tuple[str, ...] | None = None, cluster: str | None = None, *,
                   user: str | None = None, q: str | None = None, include_deleted: bool = False) -> int:
        query = select(func.count().label("n")).select_from(runs)
        rows = self.fetch(self._filter(query, statuses, cluster, user, q, include_deleted))
        return int(rows[0]["n"])

    def delete_run(self, run_id: str, *, unpublish: Callable[[], None] | None = None, soft: bool = False) -> bool:
        """Forget a run; its resumptions, events, metrics and lease go with it (ON DELETE CASCADE). `soft`:
        its row stays, marked deleted (listed only on request); its name is free either way (the unique
        name is over runs not deleted). `unpublish` (moving the run's folder out of the way) runs inside
        the transaction: once the name is free again, a new run of that name may write its folder, which
        a late removal must not reach. False if the run is not there (or already deleted)."""
        where = (runs.c.team == self.team, runs.c.id == run_id, runs.c.deleted.is_(None))
        statement = update(runs).where(*where).values(deleted=time.time()) if soft else delete(runs).where(*where)
        return self._delete(statement, unpublish)

    def update_run(self, run_id: str, **fields: Any) -> None:
        fields.setdefault("updated", time.time())
        with self.write(run_id) as c:
            c.execute(update(runs).where(runs.c.team == self.team, runs.c.id == run_id)
                      .values(**{k: encode(v, k) for k, v in fields.items()}))

    def edit_spec(self, run_id: str, edit: Callable[[dict[str, Any]], dict[str, Any] | None],
                  publish: Callable[[dict[str, Any]], None]) -> bool:
        """Replace a run's stored spec by `edit(stored spec)` (None: nothing to change) and write it out by
        `publish`, in one transaction: edits made at once apply one after the other, each to the spec the
        one before stored, so none is lost, and the published spec is the stored one. False if the run
        is gone or nothing changed."""
        with self.write() as c:
            query = select(runs.c.spec).where(runs.c.team == self.team, runs.c.id == run_id).with_for_update()
            stored = c.execute(query).scalar()
            spec = edit(json.loads(stored)) if stored is not None else None
            if spec is None:
                return False
            c.execute(update(runs).where(runs.c.id == run_id).values(spec=json.dumps(spec), updated=time.time()))
            publish(spec)
            return True

    def request(self, run_id: str, request: str | None, arg: str | None = None) -> None:
        """Ask the supervisor to stop, move or restart a run (it acts on its next pass)."""
        self.update_run(run_id, request=request, request_arg=arg)

    # --- resumptions ------------------------------------------------------------------------------

    def add_resumption(self, res: ResumptionRecord) -> None:
        with self.write(res.run_id) as c:
            c.execute(insert(resumptions).values(**columns(res)))

    def update_resumption(self, run_id: str, idx: int, **fields: Any) -> None:
        with self.write(run_id) as c:
            c.execute(update(resumptions).where(resumptions.c.run_id == run_id, resumptions.c.idx == idx)
                      .values(**{k: encode(v, k) for k, v in fields.items()}))

    def record_submission(self, run_id: str, idx: int, handle: dict[str, Any]) -> None:
        """The job of a SUBMITTING resumption exists: store its handle and queue the run, in one
        transaction (a crash between the two would leave a PENDING run whose job nobody watches)."""
        with self.write(run_id) as c:
            c.execute(update(resumptions).where(resumptions.c.run_id == run_id, resumptions.c.idx == idx).values(
                status=QUEUED, job_id=str(handle.get("job_id")), handle=json.dumps(handle),
                nodes=json.dumps(list(handle.get("nodes") or []))))
            c.execute(update(runs).where(runs.c.id == run_id).values(status=QUEUED, next_cause=None, not_before=None,
                                                                     updated=time.time()))

    def delete_resumption(self, run_id: str, idx: int) -> None:
        """Forget a SUBMITTING resumption whose job was never created."""
        with self.write(run_id) as c:
            c.execute(delete(resumptions).where(resumptions.c.run_id == run_id, resumptions.c.idx == idx))

    def resumptions(self, run_id: str) -> list[ResumptionRecord]:
        rows = self.fetch(select(resumptions).where(resumptions.c.run_id == run_id).order_by(resumptions.c.idx))
        return [from_row(ResumptionRecord, r) for r in rows]

    def resumptions_of(self, run_ids: list[str]) -> dict[str, list[ResumptionRecord]]:
        """The resumptions of many runs in a few queries (a page of `run list`, not one query per run)."""
        return self._records_of(ResumptionRecord, resumptions, run_ids, resumptions.c.idx)

    def current_resumption(self, run_id: str) -> ResumptionRecord | None:
        rows = self.fetch(select(resumptions).where(resumptions.c.run_id == run_id)
                          .order_by(resumptions.c.idx.desc()).limit(1))
        return from_row(ResumptionRecord, rows[0]) if rows else None

    # --- events -----------------------------------------------------------------------------------

    def add_event(self, run_id: str, kind: str, message: str, data: dict[str, Any] | None = None,
                  at: float | None = None) -> None:
        """Record an event; dropped if the run was deleted meanwhile (a supervisor pass that just ended
        it may still write one, and a foreign-key error there would stop the supervisor)."""
        row = {"run_id": run_id, "team": self.team, "time": at or time.time(), "kind": kind, "message": message,
               "data": json.dumps(data) if data else None}
        try:
            with self.write(run_id) as c:
                if c.execute(select(runs.c.id).where(runs.c.team == self.team, runs.c.id == run_id)).first():
                    c.execute(insert(events).values(**row))
        except IntegrityError:   # deleted between the check and the insert (PostgreSQL)
            pass

    def events(self, run_id: str, after_id: int = 0) -> list[EventRecord]:
        rows = self.fetch(select(events).where(events.c.run_id == run_id, events.c.id > after_id).order_by(events.c.id))
        return [from_row(EventRecord, r) for r in rows]

    def events_of(self, run_ids: list[str]) -> dict[str, list[EventRecord]]:
        """The events of many runs in a few queries (see `resumptions_of`)."""
        return self._records_of(EventRecord, events, run_ids, events.c.id)

    def page_events(self, run_id: str | None = None, kind: str | None = None, *, cursor: str | None = None,
                    limit: int = 50) -> Page[EventRecord]:
        """(the team's events, or one run's, oldest first, optionally of one kind; the next page's cursor)."""
        query = select(events).where(events.c.team == self.team)
        if run_id is not None:
            query = query.where(events.c.run_id == run_id)
        if kind is not None:
            query = query.where(events.c.kind == kind)
        if cursor:
            (last,) = decode_cursor(cursor, (int,))
            query = query.where(events.c.id > last)
        records = [from_row(EventRecord, r) for r in
                   self.fetch(query.order_by(events.c.id).limit(check_limit(limit) + 1))]
        more = len(records) > limit
        records = records[:limit]
        return records, encode_cursor(records[-1].id) if more else None

    def _records_of(self, cls: type, table: Any, run_ids: list[str], order: Any) -> dict[str, list[Any]]:
        """run id -> its rows of `table`, queried in chunks of run ids."""
        out: dict[str, list[Any]] = {i: [] for i in run_ids}
        for start in range(0, len(run_ids), _CHUNK):
            chunk = run_ids[start:start + _CHUNK]
            for row in self.fetch(select(table).where(table.c.run_id.in_(chunk)).order_by(table.c.run_id, order)):
                out[row["run_id"]].append(from_row(cls, row))
        return out

    # --- nodes ------------------------------------------------------------------------------------

    def record_node_fault(self, cluster: str, node: str, reason: str, *, exclude_after: int = 2,
                          hard: bool = False) -> tuple[int, bool]:
        """Count a failure implicating `node`; it is excluded at `exclude_after` faults, or at once when
        the scheduler itself reported the node failed (`hard`). Returns (faults, excluded)."""
        try:
            return self._node_fault(cluster, node, reason, exclude_after, hard)
        except IntegrityError:   # another supervisor counted this node's first fault at the same moment
            return self._node_fault(cluster, node, reason, exclude_after, hard)

    def _node_fault(self, cluster: str, node: str, reason: str, exclude_after: int, hard: bool) -> tuple[int, bool]:
        key = (node_faults.c.team == self.team, node_faults.c.cluster == cluster, node_faults.c.node == node)
        with self.write() as c:
            before = c.execute(select(node_faults.c.faults).where(*key).with_for_update()).scalar()
            faults = (before or 0) + 1
            excluded = hard or faults >= exclude_after
            values = {"faults": faults, "excluded": int(excluded), "reason": reason, "updated": time.time()}
            if before is None:
                c.execute(insert(node_faults).values(team=self.team, cluster=cluster, node=node, **values))
            else:
                c.execute(update(node_faults).where(*key).values(**values))
        return faults, excluded

    def node_faults(self, cluster: str) -> list[dict[str, Any]]:
        rows = self.fetch(select(node_faults).where(node_faults.c.team == self.team, node_faults.c.cluster == cluster)
                          .order_by(node_faults.c.node))
        return [{k: v for k, v in r.items() if k != "team"} for r in rows]

    def excluded_nodes(self, cluster: str) -> list[str]:
        return [r["node"] for r in self.node_faults(cluster) if r["excluded"]]

    def clear_node(self, cluster: str, node: str) -> bool:
        return self._delete(delete(node_faults).where(node_faults.c.team == self.team, node_faults.c.cluster == cluster,
                                                      node_faults.c.node == node))
