"""The server database: one SQLAlchemy engine, a session factory, and the migrations run at start.

SQLite (the default) gets WAL and a busy timeout, so the API's threads and the admin CLI can write
beside each other; any other URL (PostgreSQL for a team) is used as SQLAlchemy opens it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
BUSY_TIMEOUT_MS = 30_000


def make_engine(db_url: str) -> Engine:
    """An engine for `db_url`; a malformed URL or a missing driver is a ValueError naming the URL."""
    try:
        url = make_url(db_url)
        if url.get_backend_name() == "sqlite":
            engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000})
            event.listen(engine, "connect", _sqlite_pragmas)
            return engine
        return create_engine(url, pool_pre_ping=True)
    except (ArgumentError, ImportError) as exc:
        raise ValueError(f"database URL {safe_url(db_url)!r} cannot be used: {exc}") from None


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def migrate(db_url: str | Engine) -> None:
    """Bring the schema to the newest migration (creates every table on a fresh database). Needs no
    alembic.ini: the script folder is found next to this file, so it works from an installed package."""
    engine = db_url if isinstance(db_url, Engine) else make_engine(db_url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    if not isinstance(db_url, Engine):
        engine.dispose()


def safe_url(db_url: str) -> str:
    """The URL with its password hidden, for messages and the start banner."""
    try:
        return make_url(db_url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<malformed database URL>"
