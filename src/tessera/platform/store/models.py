"""The server's own tables: teams, users, API keys (hashed) and the audit log.

Runs are not here: each team's platform home (state.db) owns them, and who submitted a run is that
database's `runs.user` column. The schema is created and changed only by the Alembic migrations in
migrations/versions/, which must match these classes.
"""

from __future__ import annotations

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, Text, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


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


class AuditEntry(Base):
    """Who did what to which object; names, not ids, so an entry outlives the user or team it names."""
    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    user: Mapped[str] = mapped_column(String(63))
    team: Mapped[str] = mapped_column(String(63), index=True)
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(255))
    detail: Mapped[str] = mapped_column(Text, default="")
    # Written before the change (audit.py): True until the change is made, or settled at the next start.
    pending: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false(), index=True)
    ref: Mapped[str | None] = mapped_column(String(64), nullable=True)   # the id of the run a submit makes
