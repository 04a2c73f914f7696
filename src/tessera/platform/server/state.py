"""What every request handler reaches through `request.app.state.server`: settings, accounts, audit log,
the team platforms, and this replica (its id, and its supervision thread), built once by create_app."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from tessera.platform.server.accounts import Accounts
from tessera.platform.server.audit import AuditLog
from tessera.platform.server.settings import ServerSettings
from tessera.platform.server.teams import TeamPlatforms
from tessera.platform.store.leases import Replica
from tessera.platform.supervision.replica import ReplicaSupervision


@dataclass
class ServerState:
    settings: ServerSettings
    engine: Engine
    accounts: Accounts
    audit: AuditLog
    teams: TeamPlatforms
    replica: Replica
    supervision: ReplicaSupervision
