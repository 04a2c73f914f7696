"""The store's database: one SQLAlchemy engine per URL, its transactions, and the migrations.

SQLite (the standalone CLI's `$TESSERA_HOME/store.db`, or a server's default) runs in WAL mode with a busy
timeout, and a write transaction takes the write lock when it begins (`BEGIN IMMEDIATE`, by `writing`):
a transaction that first reads and then writes could otherwise fail at once with "database is locked"
when another writer committed in between, instead of waiting. Reads begin deferred, beside the writer.
PostgreSQL (a team server with replicas) is used as SQLAlchemy opens it; what must not interleave there
says so itself (unique constraints, `FOR UPDATE` on lease rows).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, Table, create_engine, event, make_url, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.dml import Insert

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
BUSY_TIMEOUT_MS = 30_000
_engines: dict[str, Engine] = {}
_migrated: weakref.WeakSet[Engine] = weakref.WeakSet()
_lock = threading.Lock()
_held = threading.local()   # the connection `one_reader` holds for this thread's reads


def make_engine(db_url: str) -> Engine:
    """A new engine for `db_url`; a malformed URL or a missing driver is a ValueError naming the URL."""
    try:
        url = make_url(db_url)
        if url.get_backend_name() == "sqlite":
            # a connection is cheap, and one waiting for the write lock holds its own: a pool as large as
            # the server's worker threads, so none of them waits for a connection instead
            engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
                                   pool_size=10, max_overflow=50)
            event.listen(engine, "connect", _sqlite_connect)
            event.listen(engine, "begin", _sqlite_begin)
            return engine
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=30)
    except (ArgumentError, ImportError) as exc:
        raise ValueError(f"database URL {safe_url(db_url)!r} cannot be used: {exc}") from None


def shared_engine(db_url: str) -> Engine:
    """The engine of `db_url` shared by everything in this process (a Platform is made per call of the
    SDK, per request of the server: it must not make an engine, and a pool, each time), migrated."""
    with _lock:
        engine = _engines.get(db_url)
        if engine is None:
            engine = _engines[db_url] = make_engine(db_url)
    migrate(engine)
    return engine


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None   # transactions are begun by _sqlite_begin, not the driver
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def _sqlite_begin(connection: Connection) -> None:
    immediate = connection.get_execution_options().get("write")
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


@contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """A write transaction (committed at the end, rolled back on an exception)."""
    with engine.connect() as connection:
        connection.execution_options(write=True)
        with connection.begin():
            yield connection


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction: one snapshot for every statement in it (inside `one_reader`, its one)."""
    held = getattr(_held, "connection", None)
    if held is not None and held.engine is engine:
        yield held
        return
    with engine.connect() as connection, connection.begin():
        yield connection


@contextmanager
def one_reader(engine: Engine) -> Iterator[None]:
    """Every `reading` of `engine` in this thread inside the block shares one connection and transaction:
    a request's several reads (a page of runs, its resumptions, events and total) take one connection from
    the pool, with its liveness ping, BEGIN and COMMIT, instead of one each: on a busy host each of those
    round trips costs milliseconds. Only around reads: on SQLite the transaction's snapshot would not show
    what this thread writes meanwhile through another connection."""
    if getattr(_held, "connection", None) is not None:
        yield
        return
    with reading(engine) as connection:
        _held.connection = connection
        try:
            yield
        finally:
            _held.connection = None


def _dialect_insert(connection: Connection, table: Table, values: dict[str, Any]) -> Any:
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    return dialect.insert(table).values(**values)


def upsert(connection: Connection, table: Table, values: dict[str, Any], keys: list[str]) -> Insert:
    """INSERT of `values`, or UPDATE of the row with the same `keys` (one statement: no window between
    a delete and an insert for another writer to fall into)."""
    statement = _dialect_insert(connection, table, values)
    return statement.on_conflict_do_update(index_elements=keys,
                                           set_={k: v for k, v in values.items() if k not in keys})


def insert_or_ignore(connection: Connection, table: Table, values: dict[str, Any], keys: list[str]) -> bool:
    """INSERT of `values` unless a row with the same `keys` exists; True if it was inserted. Told by the
    row RETURNING gives back, not by `rowcount`: PostgreSQL's driver reports -1 for this statement."""
    statement = (_dialect_insert(connection, table, values).on_conflict_do_nothing(index_elements=keys)
                 .returning(table.c[keys[0]]))
    return connection.execute(statement).first() is not None


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def head() -> str:
    head_revision = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head_revision is not None
    return head_revision


def _current(engine: Engine) -> str | None:
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except DBAPIError:   # no alembic_version table yet: a new database
        return None


@contextmanager
def _without_foreign_keys(engine: Engine) -> Iterator[Connection]:
    """A write connection (not yet begun) for the migrations. On SQLite its foreign keys are off: a
    migration that changes a constraint rebuilds the table (SQLite's only way), and dropping the old
    table with foreign keys on would delete every row that references it (ON DELETE CASCADE). The
    pragma cannot change inside a transaction, so it is set before BEGIN and restored after."""
    with engine.connect() as connection:
        connection.execution_options(write=True)
        if connection.dialect.name != "sqlite":
            yield connection
            return
        driver = connection.connection.driver_connection
        assert driver is not None
        driver.execute("PRAGMA foreign_keys = OFF")
        try:
            yield connection
        finally:
            driver.execute("PRAGMA foreign_keys = ON")


def _check_foreign_keys(connection: Connection) -> None:
    """What the migrations did with foreign keys off still holds (SQLite; before COMMIT)."""
    if connection.dialect.name == "sqlite":
        broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
        if broken:
            raise RuntimeError(f"the store's migration left rows whose foreign keys fail: {broken[:5]}")


def migrate(db_url: str | Engine) -> None:
    """Bring the schema to the newest migration (creates every table on a fresh database), once per engine
    in a process. Needs no alembic.ini: the script folder is found next to this file, so it works from
    an installed package. Replicas starting at once upgrade one at a time: the upgrade runs in a write
    transaction (SQLite) or under an advisory lock (PostgreSQL), and looks at the version again inside it."""
    engine = db_url if isinstance(db_url, Engine) else make_engine(db_url)
    if engine in _migrated:
        return
    target = head()
    if _current(engine) != target:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with _without_foreign_keys(engine) as connection, connection.begin():
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(2323)"))   # released at commit
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            _check_foreign_keys(connection)
    if isinstance(db_url, Engine):
        _migrated.add(engine)
    else:
        engine.dispose()


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def safe_url(db_url: str) -> str:
    """The URL with its password hidden, for messages and the start banner."""
    try:
        return make_url(db_url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<malformed database URL>"
