"""Alembic's entry point for the server database. The server runs it programmatically (db.migrate) with
an open connection in `config.attributes["connection"]`; `alembic -x url=...` from a shell works too."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from tessera.platform.store.models import Base

target_metadata = Base.metadata


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option("sqlalchemy.url")
    with create_engine(url).connect() as conn:
        _run(conn)
