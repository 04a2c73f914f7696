"""The store's settings table: one value per key, e.g. the secrets key's fingerprint and which old homes
were imported (legacy.py)."""

from __future__ import annotations

from sqlalchemy import Connection, Engine, insert, select
from sqlalchemy.exc import IntegrityError

from tessera.platform.store.db import reading, writing
from tessera.platform.store.models import settings

KEY_FINGERPRINT = "secrets_key_fingerprint"


def get_setting(engine: Engine | Connection, key: str) -> str | None:
    query = select(settings.c.value).where(settings.c.key == key)
    if isinstance(engine, Connection):
        return engine.execute(query).scalar()
    with reading(engine) as c:
        return c.execute(query).scalar()


def put_setting(connection: Connection, key: str, value: str) -> None:
    """Inside the caller's transaction (a key is written once: a second write is a unique-key error)."""
    connection.execute(insert(settings).values(key=key, value=value))


def claim_setting(engine: Engine, key: str, value: str) -> str:
    """The key's value: `value` if the key had none (it is stored), else the one stored before (also
    when another process stored one at the same moment)."""
    try:
        with writing(engine) as c:
            stored = get_setting(c, key)
            if stored is None:
                put_setting(c, key, value)
                return value
            return stored
    except IntegrityError:
        stored = get_setting(engine, key)
        assert stored is not None
        return stored
