"""The one schema of the platform's state: every table, for the standalone CLI (SQLite under
$TESSERA_HOME) and for a team server (`--db`: SQLite or PostgreSQL) alike.

Accounts (teams, users, API keys) are ORM classes, which accounts.py queries; everything else is a Core
table, which the store's query modules (state.py, audit.py, leases.py, ...) write with plain statements.
Every team-scoped table has a `team` column, and what must be unique per team (a run's, a cluster's, a
secret's name) is a constraint here, so the database decides between racing writers. Names are stored
up to 255 characters: new ones are bounded at 63 where they are made (spec/schema.py), but a home made by
an older version may hold longer ones, and importing it must not lose them.

The schema is created and changed only by the Alembic migrations in migrations/versions/, which must
match these definitions.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAME = 255     # column width of names (see the module's docstring)
RUN_ID = 32
LIVE = text("deleted IS NULL")   # a run not (soft-)deleted


class Base(DeclarativeBase):
    pass


metadata = Base.metadata


class Team(Base):
    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    created: Mapped[float] = mapped_column(Float)


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"), index=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created: Mapped[float] = mapped_column(Float)
    team: Mapped[Team] = relationship(lazy="joined")


class ApiKey(Base):
    """A key is shown once; only its sha256 (hex) is kept, and its first characters to name it."""
    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    created: Mapped[float] = mapped_column(Float)
    revoked: Mapped[float | None] = mapped_column(Float, nullable=True)
    user: Mapped[User] = relationship(lazy="joined")


# Who did what to which object; names, not ids, so an entry outlives the user or team it names. Written in
# the transaction of the change it records (audit.py).
audit = Table(
    "audit", metadata,
    Column("id", Integer, primary_key=True),
    Column("time", Float, nullable=False, index=True),
    Column("user", String(63), nullable=False),
    Column("team", String(63), nullable=False, index=True),
    Column("action", String(32), nullable=False),
    Column("target", String(255), nullable=False),
    Column("detail", Text, nullable=False),
    Index("ix_audit_team_id", "team", "id"),
)

clusters = Table(
    "clusters", metadata,
    Column("team", String(63), primary_key=True),
    Column("name", String(NAME), primary_key=True),
    Column("type", String(32), nullable=False),
    Column("config", Text, nullable=False),
    Column("created", Float, nullable=False),
)

runs = Table(
    "runs", metadata,
    Column("id", String(RUN_ID), primary_key=True),
    Column("team", String(63), nullable=False),
    Column("name", String(NAME), nullable=False),
    Column("spec", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("cluster", String(NAME), nullable=False),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
    Column("ended", Float),
    Column("request", String(16)),
    Column("request_arg", Text),
    Column("retries_used", Integer, nullable=False, default=0),
    Column("system_retries", Integer, nullable=False, default=0),
    Column("failure_kind", String(64)),
    Column("first_error", Text),
    Column("not_before", Float),
    Column("folder", Text, nullable=False),
    Column("workdir", Text),
    Column("next_cause", Text),
    Column("user", String(NAME)),
    Column("metrics_next", Integer, nullable=False, default=0),   # where ingesting its metrics goes on
    Column("deleted", Float),   # when MCLI's deleteRuns deleted it (soft: the row stays, listed on request)
    # a name is unique among the team's runs that are not deleted, so a deleted run's name can be used again
    Index("uq_runs_team_name", "team", "name", unique=True, sqlite_where=LIVE, postgresql_where=LIVE),
    # a page of the runs list reads an index in order instead of sorting every run of the team; a filtered
    # page's total counts the entries of a partial index of the live runs (migration 0005)
    Index("ix_runs_team_created", "team", "created", "id"),
    Index("ix_runs_team_status_created", "team", "status", "created", "id", sqlite_where=LIVE, postgresql_where=LIVE),
    Index("ix_runs_team_user_created", "team", "user", "created", "id", sqlite_where=LIVE, postgresql_where=LIVE),
    Index("ix_runs_status", "status"),          # supervision looks for active runs of every team
)

resumptions = Table(
    "resumptions", metadata,
    Column("run_id", String(RUN_ID), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("cluster", String(NAME), nullable=False),
    Column("cause", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("job_id", Text),
    Column("handle", Text),
    Column("nodes", Text, nullable=False, default="[]"),
    Column("folder", Text, nullable=False),
    Column("submitted", Float, nullable=False),
    Column("start", Float),
    Column("end", Float),
    Column("exit_code", Integer),
    Column("outcome", String(64)),
    Column("detail", Text),
    Column("last_beat", Text),
    Column("last_progress", Float),
    Column("stop_sent", Float),
    Column("kill_sent", Float),
    Column("stop_reason", String(32)),
    Column("first_beat", Text),
    Column("events_offset", Integer, nullable=False, default=0),
)

events = Table(
    "events", metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", String(RUN_ID), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("team", String(63), nullable=False),
    Column("time", Float, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("message", Text, nullable=False),
    Column("data", Text),
    Index("ix_events_run", "run_id", "id"),
    Index("ix_events_team", "team", "id"),
)

node_faults = Table(
    "node_faults", metadata,
    Column("team", String(63), primary_key=True),
    Column("cluster", String(NAME), primary_key=True),
    Column("node", String(255), primary_key=True),
    Column("faults", Integer, nullable=False),
    Column("excluded", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    Column("updated", Float, nullable=False),
)

# What runs report for plots, one row per line a run wrote to its metrics file (masked as its logs are).
metrics = Table(
    "metrics", metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", String(RUN_ID), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("step", Integer),
    Column("data", Text, nullable=False),
    Index("ix_metrics_run", "run_id", "id"),
)

# Encrypted records (a Fernet token of the secret's JSON, secrets/vault.py); name and type in the clear.
secrets = Table(
    "secrets", metadata,
    Column("team", String(63), primary_key=True),
    Column("name", String(NAME), primary_key=True),
    Column("type", String(32), nullable=False),
    Column("created", Float, nullable=False),
    Column("token", LargeBinary, nullable=False),
)

# Each server process (and each home's standalone supervisor) that supervises runs.
replicas = Table(
    "replicas", metadata,
    Column("id", String(64), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("boot_id", String(64), nullable=False),
    Column("url", Text),
    Column("started", Float, nullable=False),
    Column("beat", Float, nullable=False),
)

# Who supervises a run: `owner` (a replica id) until `expires`; `token` grows at every change of owner and
# fences the writes of a replica that lost the lease (leases.py).
run_leases = Table(
    "run_leases", metadata,
    Column("run_id", String(RUN_ID), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("owner", String(64)),
    Column("token", Integer, nullable=False),
    Column("heartbeat", Float, nullable=False),
    Column("expires", Float, nullable=False, index=True),
)

# One value per key: the secrets key's fingerprint, and the old homes imported (legacy.py).
settings = Table(
    "settings", metadata,
    Column("key", String(255), primary_key=True),
    Column("value", Text, nullable=False),
)
