"""`Platform`: everything `tessera run|cluster|secret` does, in this process, over the store: one of the
two implementations of the platform's interface (api/interface.py); the server's remote client
(`RemotePlatform`) is the other, with the same methods and the same returns. The module-level functions
(`create_run`, `follow_logs`, ...) are in api/functions.py.

Actions that need watching (create, stop, move, restart, delete) start the supervisor if it is not
running; it keeps going after this process exits.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from tessera.platform.api.cluster_verbs import ClusterVerbs
from tessera.platform.api.inputs import as_spec, cluster_of, os_user, run_statuses
from tessera.platform.api.models import PAGE, EventPage, RunPage
from tessera.platform.errors import (
    PlatformError,
    RunExists,
    RunFailed,
    RunNotFound,
    RunStateError,
    SpecError,
)
from tessera.platform.home import tessera_home
from tessera.platform.runs import logs
from tessera.platform.runs.artifacts import ArtifactStore, artifacts_url
from tessera.platform.runs.folder import move_away, write_run_folder, write_spec
from tessera.platform.runs.info import Event, Resumption, Run
from tessera.platform.runs.shipping import adopt_history
from tessera.platform.secrets.vault import SecretStore
from tessera.platform.spec.edits import cloned_spec, updated_scheduling
from tessera.platform.spec.run_spec import RunSpec
from tessera.platform.store.audit import not_noting
from tessera.platform.store.db import one_reader
from tessera.platform.store.homes import LOCAL_TEAM, home_engine
from tessera.platform.store.leases import lease_of, leases_of
from tessera.platform.store.metric_points import read_points
from tessera.platform.store.paging import encode_cursor
from tessera.platform.store.state import (
    PENDING,
    TERMINAL,
    EventRecord,
    RunRecord,
    StateDB,
    new_run_id,
)
from tessera.platform.supervision.supervisor import ensure_supervisor

_ORDER = {status: i for i, status in enumerate(("PENDING", "QUEUED", "STARTING", "RUNNING", "STOPPING"))}
STOP_MARGIN = 30.0   # seconds beyond a run's stop_grace that delete_run waits for it to stop


class Platform(ClusterVerbs):
    """One team's platform. `Platform(home)` is the standalone CLI's: team "local" in the home's own store
    (`$TESSERA_HOME/store.db`), supervised by the home's detached supervisor, which an action that needs
    watching starts if it is not running. A server makes `Platform(team_home, engine=E, team=T,
    supervise=wake)`: the team's view of the server's store, supervised by the replicas (`wake` tells
    this replica's supervision thread to look now); `home` is then where this replica keeps the team's
    run folders."""

    def __init__(self, home: str | Path | None = None, *, engine: Engine | None = None, team: str = LOCAL_TEAM,
                 supervise: Callable[[], object] | None = None, artifacts: ArtifactStore | None = None) -> None:
        self.home = tessera_home(home)
        self.team = team
        # run files, logs and metrics (runs/artifacts.py): the server's root, else a folder in the home
        self.artifacts = artifacts or ArtifactStore.open(artifacts_url(self.home), team)
        engine = engine if engine is not None else home_engine(self.home)
        self.db = StateDB(engine, team)
        self.secrets = SecretStore(self.home, engine=engine, team=team)
        self._supervise = supervise or (lambda: ensure_supervisor(self.home))

    def close(self) -> None:
        """Nothing to release (the store's engine is shared); kept for callers that close what they open."""

    # --- runs -------------------------------------------------------------------------------------

    def create_run(self, spec: RunSpec | dict[str, Any] | str | Path, *, cluster: str | None = None,
                   workdir: str | Path | None = None, supervise: bool = True, user: str | None = None) -> Run:
        """Validate and submit a run; the supervisor starts it. `user` is who submitted it (the server
        passes its API user); the OS user by default. The
        database decides between racing submissions of one name before any file is written (RunExists
        for the losers); the winner's folder holds the winner's spec."""
        spec = as_spec(spec)
        cluster = cluster_of(spec, cluster)
        spec = spec.model_copy(update={"compute": spec.compute.model_copy(update={"cluster": cluster})})
        with one_reader(self.db.engine):    # the cluster and the secrets, one connection
            backend = self.backend(cluster)
            known = {i.name for i in self.secrets.list()} if spec.secrets else set()
        backend.check(spec)
        missing = [s for s in spec.secrets if s not in known]
        if missing:
            raise SpecError(f"run {spec.name!r} names secret(s) that do not exist: {', '.join(missing)} "
                            f"(create them with `tessera secret create ...`)")
        folder = self.home / "runs" / spec.name
        now = time.time()
        record = RunRecord(new_run_id(), spec.name, spec.model_dump(mode="json"), PENDING, cluster,
                           now, now, str(folder), workdir=str(Path(workdir or Path.cwd()).resolve()),
                           next_cause="submitted", user=user or os_user())
        created = f"run created for cluster {cluster}"
        try:
            self.db.insert_run(record, event=created, publish=lambda: write_run_folder(folder, spec))
        except RunExists:
            existing = self.db.get_run(spec.name)
            status = f" ({existing.status})" if existing else ""
            raise RunExists(f"a run named {spec.name!r} exists{status}; choose another name, or "
                            f"`tessera run restart {spec.name}`") from None
        if supervise:
            self._supervise()
        # what was stored, as stored: reading it back would cost a request two more round trips
        return Run.from_record(record, [], [EventRecord(0, record.id, now, "created", created)])

    def _record(self, name: str, include_deleted: bool = False) -> RunRecord:
        record = self.db.get_run(name, include_deleted=include_deleted)
        if record is None:
            raise RunNotFound(f"no run named {name!r} (see `tessera run list`)")
        return record

    def get_run(self, name: str, *, include_deleted: bool = False) -> Run:
        """The run of that name or id; a run deleted through MCLI's API (`soft`) only with `include_deleted`."""
        with one_reader(self.db.engine):
            r = self._record(name, include_deleted)
            return Run.from_record(r, self.db.resumptions(r.id), self.db.events(r.id))

    def list_runs(self, status: str | Iterable[str] | None = None, cluster: str | None = None,
                  limit: int | None = None, *, user: str | None = None, q: str | None = None) -> list[Run]:
        """The newest `limit` runs (all without one), filtered by status, cluster, user and `q` (part of
        the name). Resumptions and events come in two queries for the whole list."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 (got {limit})")
        records = self.db.list_runs(run_statuses(status), cluster, limit, user=user, q=q)
        ids = [r.id for r in records]
        resumptions, events = self.db.resumptions_of(ids), self.db.events_of(ids)
        return [Run.from_record(r, resumptions[r.id], events[r.id]) for r in records]

    def count_runs(self, status: str | Iterable[str] | None = None, cluster: str | None = None, *,
                   user: str | None = None, q: str | None = None) -> int:
        """How many runs `list_runs` would return without a limit (a page's total)."""
        return self.db.count_runs(run_statuses(status), cluster, user=user, q=q)

    def run_summaries(self, status: str | Iterable[str] | None = None, cluster: str | None = None,
                      limit: int | None = None, *, user: str | None = None, q: str | None = None
                      ) -> tuple[list[dict[str, Any]], int]:
        """(a summary row per run, how many match): what `run list` shows."""
        rows = [run.summary() for run in self.list_runs(status, cluster, limit, user=user, q=q)]
        return rows, self.count_runs(status, cluster, user=user, q=q)

    def run_page(self, status: str | Iterable[str] | None = None, cluster: str | None = None, *,
                 user: str | None = None, q: str | None = None, cursor: str | None = None,
                 limit: int = PAGE, include_deleted: bool = False) -> RunPage:
        """A page of run summaries, newest first, and the cursor of the next (None after the last): what
        the API's runs list and the console show. Runs submitted meanwhile never shift a page. Deleted
        runs (`soft`) come only with `include_deleted` (MCLI's API)."""
        statuses = run_statuses(status)
        with one_reader(self.db.engine):    # its four queries on one connection
            records, next_cursor = self.db.page_runs(statuses, cluster, user=user, q=q, cursor=cursor, limit=limit,
                                                     include_deleted=include_deleted)
            ids = [r.id for r in records]
            resumptions, events = self.db.resumptions_of(ids), self.db.events_of(ids)
            total = self.db.count_runs(statuses, cluster, user=user, q=q, include_deleted=include_deleted)
        items = [Run.from_record(r, resumptions[r.id], events[r.id]).summary() for r in records]
        return RunPage.model_validate({"items": items, "next_cursor": next_cursor, "total": total})

    def wait_for_run_status(self, name: str, status: str | Iterable[str], timeout: float | None = None,
                            poll: float = 0.25) -> Run:
        """Wait until the run reaches `status`, or passes it: waiting for an active status (e.g. RUNNING)
        returns once the run is there or further along, finished included. Waiting for terminal statuses
        raises RunFailed if the run ends in another one; TimeoutError after `timeout` seconds."""
        wanted = set(run_statuses(status) or ())
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
        self._supervise()
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
            self._supervise()
            return self.get_run(name)
        if cluster and cluster != record.cluster:
            return self._request(name, "move", cluster)
        return self._request(name, "restart")

    def delete_run(self, name: str, *, soft: bool = False) -> None:
        """Forget a run: stop it first if it is active (RunStateError if it does not stop within its
        stop_grace and a margin), then remove its record, resumptions, events and folder. `soft` (MCLI's
        deleteRuns): the files go all the same, the record stays, marked deleted: found only with
        `include_deleted`, its name free for a new run."""
        record = self._record(name)
        if record.status not in TERMINAL:
            with not_noting():   # the delete's audit entry goes with the delete below, or not at all
                self.stop_run(name)
            grace = RunSpec.model_validate(record.spec).scheduling.stop_grace
            try:
                self.wait_for_run_status(name, TERMINAL, timeout=grace + STOP_MARGIN)
            except TimeoutError:
                raise RunStateError(f"run {name} did not stop within {grace + STOP_MARGIN:g} s (it is "
                                    f"{self._record(name).status}); not deleted, try again later") from None
        folder = Path(record.folder)
        ours = folder.parent == self.home / "runs"   # never remove a folder outside this home's runs
        trash = folder.with_name(f".deleted-{record.id}")
        if not self.db.delete_run(record.id, unpublish=(lambda: move_away(folder, trash)) if ours else None,
                                  soft=soft):
            raise RunNotFound(f"no run named {name!r}: it was deleted meanwhile")
        self.artifacts.delete_run(record.id)
        if ours:
            shutil.rmtree(trash, ignore_errors=True)
        if ours and trash.exists():
            raise PlatformError(f"run {name} was deleted, but its folder {trash} could not be removed")

    def update_run(self, name: str, *, priority: str | None = None, max_duration: float | str | None = None,
                   max_retries: int | None = None, preemptible: bool | None = None,
                   retry_on_system_failure: bool | None = None) -> Run:
        """Change a run's scheduling (bounds as at submit). The supervisor reads the stored spec on every
        pass, so a lowered max_retries or max_duration applies to the current resumption too, and
        retry_on_system_failure to the next failure; preemptible applies from the run's next submission
        (a Slurm job's QOS is chosen when it is submitted)."""
        record = self._record(name)
        changes: list[str] = []

        def edit(stored: dict[str, Any]) -> dict[str, Any] | None:   # on the spec as stored when applied
            spec, made = updated_scheduling(RunSpec.model_validate(stored), priority=priority,
                                            max_duration=max_duration, max_retries=max_retries,
                                            preemptible=preemptible, retry_on_system_failure=retry_on_system_failure)
            changes.extend(made)
            return spec.model_dump(mode="json") if made else None

        if self.db.edit_spec(record.id, edit, lambda new: write_spec(Path(record.folder), RunSpec.model_validate(new), self.artifacts, record.id)):
            self.db.add_event(record.id, "updated", "scheduling updated: " + ", ".join(changes))
        return self.get_run(name)

    def clone_run(self, name: str, new_name: str, *, cluster: str | None = None, gpus: int | None = None,
                  user: str | None = None) -> Run:
        """Submit the run's spec again as `new_name` (on `cluster`, with `gpus` per node, when given),
        from the same working directory; the clone is `user`'s (default: the OS user)."""
        record = self._record(name)
        spec = cloned_spec(RunSpec.model_validate(record.spec), new_name, cluster=cluster or record.cluster,
                           gpus=gpus)
        return self.create_run(spec, workdir=record.workdir, user=user)

    def run_metrics(self, name: str, after: int = 0) -> tuple[list[dict[str, Any]], int]:
        """(metric rows the run reported after point `after`, secret values masked as in its logs; the
        point to pass next time). Its supervisor stores them as they are shipped (store/metric_points.py)."""
        rows, position = read_points(self.db, self._record(name).id, after)
        redact = self.secrets.redactor()
        return [redact.json(row) for row in rows], position

    # --- logs -------------------------------------------------------------------------------------

    def log_files(self, name: str, rank: int | None = None, resumption: int | None = None
                  ) -> tuple[Run, Resumption | None, list[logs.LogFile]]:
        """(run, resumption, [(node rank, its log in the artifacts store, torchrun prefix to keep or None)])."""
        run = self.get_run(name)
        adopt_history(self.artifacts, run.id, lambda: run, self.secrets.redactor)   # a run of an old home
        res, files = logs.log_files(self.artifacts, run, rank, resumption)
        return run, res, files

    def follow_logs(self, name: str, rank: int | None = None, resumption: int | None = None,
                    follow: bool = True, poll: float = 0.25) -> Iterator[str]:
        """Lines of the run's logs (secret values replaced by ****). With several nodes and no rank, each
        line starts with "[node R] ". Following continues into later resumptions until the run ends."""
        run = self.get_run(name)
        adopt_history(self.artifacts, run.id, lambda: run, self.secrets.redactor)   # a run of an old home
        yield from logs.follow(self.artifacts, lambda: self.get_run(name), self.secrets.redactor(), rank,
                               resumption, follow, poll)

    def describe_run(self, name: str, *, include_deleted: bool = False) -> dict[str, Any]:
        """Everything `run describe` shows; passes through the redactor as a last guard."""
        redact = self.secrets.redactor()    # (may import an old home's secret files: not in one_reader)
        with one_reader(self.db.engine):
            run = self.get_run(name, include_deleted=include_deleted)
            lease = lease_of(self.db.engine, run.id)
        return run.describe(lease, redact)

    def run_detail(self, run: Run, *, new: bool = False) -> dict[str, Any]:
        """`describe_run`'s answer for a run a verb just returned (create_run, stop_run, ...): not read
        again. A `new` run (create_run's) has had no supervisor yet: its lease is not asked for."""
        return run.describe(None if new else lease_of(self.db.engine, run.id), self.secrets.redactor())

    def describe_runs(self, run_ids: list[str], *, include_deleted: bool = False) -> list[dict[str, Any]]:
        """`describe_run` of each of these runs that exists (deleted: with `include_deleted`), in one reader."""
        redact = self.secrets.redactor()
        with one_reader(self.db.engine):
            records = {r.id: r for r in self.db.get_runs(run_ids) if include_deleted or r.deleted is None}
            ids = list(records)
            resumptions, events = self.db.resumptions_of(ids), self.db.events_of(ids)
            leases = leases_of(self.db.engine, ids)
        return [Run.from_record(records[i], resumptions[i], events[i]).describe(leases.get(i), redact)
                for i in dict.fromkeys(run_ids) if i in records]

    def run_events(self, name: str, cursor: str | None = None, limit: int = PAGE) -> EventPage:
        """The run's events after `cursor`, oldest first (the cursor of the last one given, to poll with),
        and its resumptions as they are now; passed through the redactor as `describe_run` is."""
        record = self._record(name)
        found, more = self.db.page_events(record.id, cursor=cursor, limit=limit)
        page = {"items": [asdict(Event.from_record(e)) for e in found],
                "next_cursor": more or (encode_cursor(found[-1].id) if found else cursor),
                "resumptions": [asdict(Resumption.from_record(r)) for r in self.db.resumptions(record.id)]}
        return EventPage.model_validate_json(self.secrets.redactor()(json.dumps(page)))
