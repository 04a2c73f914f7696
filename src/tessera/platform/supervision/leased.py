"""Supervision under leases: one replica's passes over the runs it holds a lease on, of every team.

A pass renews the replica's leases, takes the lease of every active run nobody holds and of every run
whose lease expired (store/leases.py), and advances each run it holds (`run_pass.step`). A run taken over
from another replica is first reconciled with what its cluster says (takeover.py). Every write of a pass
about a run is fenced by the run's lease token: when another replica took the lease meanwhile, the write
is refused (StaleLease), logged, and this replica leaves the run to its new owner. Leases of runs that
ended are released at the next pass.

The same passes run in a server replica's supervision thread (replica.py) and in a standalone home's
supervisor process (supervisor.py).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from tessera.platform.errors import PlatformError
from tessera.platform.runs.shipping import ShipLoop
from tessera.platform.store.leases import Fence, Lease, Replica, StaleLease, hold, register, release
from tessera.platform.store.state import ACTIVE, RUNNING, STARTING, STOPPING, RunRecord
from tessera.platform.supervision.context import SupervisorContext, SupervisorSettings
from tessera.platform.supervision.run_pass import step
from tessera.platform.supervision.takeover import take_over


class Supervision:
    """The runs `replica` supervises in the store of `engine`; `team_home(team)` is the folder where this
    replica keeps a team's run folders."""

    def __init__(self, engine: Engine, replica: Replica, team_home: Callable[[str], Path],
                 settings: SupervisorSettings) -> None:
        self.engine = engine
        self.replica = replica
        self.team_home = team_home
        self.settings = settings
        self.fence = Fence(replica.id)
        self.contexts: dict[str, SupervisorContext] = {}
        self.last_error: dict[str, str] = {}                # run id -> last error recorded as an event
        # ships live runs' output between passes (runs/shipping.py); started by whoever runs the passes
        self.shipping = ShipLoop(lambda: [ctx.shipper for ctx in list(self.contexts.values())])
        register(engine, replica)

    def context(self, team: str) -> SupervisorContext:
        if team not in self.contexts:
            self.contexts[team] = SupervisorContext.for_team(self.engine, team, self.team_home(team), self.settings,
                                                             self.fence)
        return self.contexts[team]

    def leases(self) -> list[Lease]:
        """Renew what this replica holds and take what is free or expired; the fence learns the tokens."""
        held = hold(self.engine, self.replica.id, self.settings.lease_seconds)
        self.fence.tokens = {lease.run_id: lease.token for lease in held}
        return held

    def tick(self) -> int:
        """One pass over every run this replica holds a lease on; returns how many are active."""
        leases = self.leases()
        by_team: dict[str, list[Lease]] = {}
        for lease in leases:
            by_team.setdefault(lease.team, []).append(lease)
        ended: list[str] = []
        active = 0
        for team, held in sorted(by_team.items()):
            ctx = self.context(team)
            previous = {lease.run_id: lease.previous for lease in held if lease.previous}
            runs = ctx.db.get_runs([lease.run_id for lease in held])
            self._watch_nodes(ctx, [r for r in runs if r.status in ACTIVE])
            for run in runs:
                if run.status not in ACTIVE:
                    ended.append(run.id)
                    continue
                active += 1
                self._advance(ctx, run, previous.get(run.id))
        if ended:
            release(self.engine, self.replica.id, ended)
        return active

    def _advance(self, ctx: SupervisorContext, run: RunRecord, previous: str | None) -> None:
        try:
            if previous:
                run = take_over(ctx, run, previous)
            step(ctx, run)
            self.last_error.pop(run.id, None)
        except StaleLease as exc:
            ctx.log(f"run {run.name}: {exc}")
            self.fence.tokens.pop(run.id, None)
        except Exception as exc:  # one broken run must not stop the others being watched
            message = f"{type(exc).__name__}: {exc}"
            if self.last_error.get(run.id) != message:   # once per distinct error, not every pass
                self.last_error[run.id] = message
                ctx.log(f"run {run.name}: {exc!r}\n{traceback.format_exc()}")
                try:
                    ctx.db.add_event(run.id, "supervisor_error", f"supervisor error (will retry): {message}")
                except StaleLease as stale:
                    ctx.log(f"run {run.name}: {stale}")

    def _watch_nodes(self, ctx: SupervisorContext, runs: list[RunRecord]) -> None:
        """Remember which nodes look unhealthy, to name the culprit when a job ends in NODE_FAIL."""
        for cluster in {r.cluster for r in runs if r.status in (STARTING, RUNNING, STOPPING)}:
            try:
                backend = ctx.backend(cluster)
                if backend.type == "local":
                    continue
                seen = ctx.unhealthy.setdefault(cluster, {})
                for node in backend.nodes():
                    if not node.healthy:
                        seen[node.name] = time.time()
            except PlatformError:
                continue

    def stop(self) -> None:
        """Give up every lease at once (a clean shutdown): another replica takes the runs over now, not
        after the leases expire."""
        self.shipping.stop()
        release(self.engine, self.replica.id)
