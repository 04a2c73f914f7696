"""Teams, users and API keys: the repository layer the admin CLI, the admin API and auth share.

A key is `tsk_` + 43 URL-safe characters (256 random bits). Only its sha256 (hex) is stored, with its
first 12 characters as a name to revoke it by; the key itself is returned once, at creation.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tessera.platform.errors import AccountExists, AccountNotFound
from tessera.platform.secrets.redaction import API_KEY_PREFIX
from tessera.platform.spec.run_spec import validate_name
from tessera.platform.store.audit import carrying
from tessera.platform.store.models import ApiKey, Team, User

KEY_PREFIX = API_KEY_PREFIX   # the masks find keys by it (redaction.py)
PREFIX_CHARS = 12


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""
    user: str
    team: str
    admin: bool


@dataclass(frozen=True)
class UserInfo:
    name: str
    team: str
    admin: bool
    created: float
    keys: list[str]       # prefixes of the user's keys that are not revoked


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Accounts:
    """Every change commits before returning, with the audit entry of the API change making it (if any,
    store/audit.py); callers never see a session."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    @contextmanager
    def _change(self) -> Iterator[Session]:
        with carrying() as carry, self.sessions.begin() as s:
            # the write lock first (SQLite: BEGIN IMMEDIATE, store/db.py): a transaction that read first
            # could not take it later when another writer committed meanwhile
            carry(s.connection(execution_options={"write": True}))
            yield s

    def create_team(self, name: str) -> str:
        validate_name(name, "team name")
        with self._change() as s:
            if s.scalar(select(Team).where(Team.name == name)):
                raise AccountExists(f"team {name!r} exists")
            s.add(Team(name=name, created=time.time()))
        return name

    def create_user(self, name: str, team: str, *, admin: bool = False) -> str:
        """Create the user (and the team if it is missing); returns the user's first API key. Another
        process may create the same new team at the same moment: then the insert is tried once more."""
        validate_name(name, "user name")
        validate_name(team, "team name")
        try:
            return self._create_user(name, team, admin)
        except IntegrityError:
            return self._create_user(name, team, admin)

    def _create_user(self, name: str, team: str, admin: bool) -> str:
        with self._change() as s:
            if s.scalar(select(User).where(User.name == name)):
                raise AccountExists(f"user {name!r} exists; give them another key with `new-key {name}`")
            row = s.scalar(select(Team).where(Team.name == team))
            if row is None:
                row = Team(name=team, created=time.time())
                s.add(row)
            user = User(name=name, team=row, admin=admin, created=time.time())
            s.add(user)
            s.flush()
            return _add_key(s, user)

    def new_key(self, user: str) -> str:
        with self._change() as s:
            row = s.scalar(select(User).where(User.name == user))
            if row is None:
                raise AccountNotFound(f"user {user!r} does not exist")
            return _add_key(s, row)

    def revoke_key(self, prefix: str) -> str:
        """Revoke the key that starts with `prefix` (its first 12 characters); returns its user."""
        with self._change() as s:
            row = s.scalar(select(ApiKey).where(ApiKey.prefix == prefix[:PREFIX_CHARS]))
            if row is None or len(prefix) < PREFIX_CHARS:
                raise AccountNotFound(f"no API key starts with {prefix!r} (give its first {PREFIX_CHARS} characters)")
            if row.revoked is None:
                row.revoked = time.time()
            return row.user.name

    def verify(self, key: str) -> Principal | None:
        """The user a key belongs to, or None for an unknown or revoked key."""
        if not key.startswith(KEY_PREFIX) or len(key) > 128:
            return None
        query = (select(User.name, Team.name, User.admin).join(ApiKey.user).join(User.team)
                 .where(ApiKey.hash == hash_key(key), ApiKey.revoked.is_(None)))
        with self.sessions() as s:     # one statement, no ORM objects: every request of the API asks it
            row = s.execute(query).first()
        return None if row is None else Principal(row[0], row[1], row[2])

    def list_users(self, team: str | None = None) -> list[UserInfo]:
        with self.sessions() as s:
            query = select(User).order_by(User.name)
            if team:
                query = query.join(Team).where(Team.name == team)
            users = s.scalars(query).all()
            keys = s.scalars(select(ApiKey).where(ApiKey.revoked.is_(None)).order_by(ApiKey.created)).all()
            return [UserInfo(u.name, u.team.name, u.admin, u.created,
                             [k.prefix for k in keys if k.user_id == u.id]) for u in users]

    def list_teams(self) -> list[str]:
        with self.sessions() as s:
            return list(s.scalars(select(Team.name).order_by(Team.name)))


def _add_key(s: Session, user: User) -> str:
    while True:
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        if not s.scalar(select(ApiKey).where(ApiKey.prefix == key[:PREFIX_CHARS])):
            break
    s.add(ApiKey(prefix=key[:PREFIX_CHARS], hash=hash_key(key), user=user, created=time.time()))
    return key
