"""`tessera server start` (the control plane: API and web console) and `tessera server admin ...` (teams,
users and API keys, acting on the server's database directly, on the server's host)."""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import typer
from sqlalchemy.exc import SQLAlchemyError

from tessera.cli.console import err, fail
from tessera.cli.output import FORMAT, WIDE, Column, output_format, print_list
from tessera.platform import PlatformError
from tessera.platform.secrets.redaction import hide_api_keys
from tessera.platform.server.accounts import Accounts
from tessera.platform.server.settings import ServerSettings

app = typer.Typer(help="The team's control plane: an HTTP API and web console over the platform.",
                  no_args_is_help=True)
admin = typer.Typer(help="Teams, users and API keys (on the server's host; keys are shown once).",
                    no_args_is_help=True)
app.add_typer(admin, name="admin")

# What `admin list-users` shows: the user whole; the key prefixes are cut first when the line is too long.
USER_COLUMNS = (Column("USER", 0), Column("TEAM", 1), Column("ADMIN", 3), Column("KEYS", 2, min_width=12))
HOME_HELP = "Server home: server.db, secret.key, teams/<team>/ (default: $TESSERA_HOME/server)."
T = TypeVar("T")
GRACEFUL_STOP = 3.0   # seconds open requests get to finish when the server stops
DB_HELP = "SQLAlchemy database URL (default: $TESSERA_DB_URL, else SQLite in the home)."
DEFAULT_LEASE_SECONDS = 30.0   # as store/leases.py (not imported here: every `tessera` command loads this module)
LEASE_HELP = ("Seconds a run's supervision lease lasts unless this replica renews it: after a replica dies, "
              "another takes its runs over once their leases expire.")
ARTIFACTS_HELP = ("Where runs' specs, logs and metrics go, shared by every replica: a folder or s3://bucket/prefix "
                  "(default: $TESSERA_ARTIFACTS_URL, else the home's folder artifacts).")


def _settings(home: Path | None, db: str | None, **more: object) -> ServerSettings:
    try:
        return ServerSettings.resolve(home=home, db_url=db, **more)  # type: ignore[arg-type]
    except (ValueError, OSError) as exc:
        fail(exc, code=2)
        raise   # not reached: fail() exits


def _accounts(home: Path | None, db: str | None) -> Accounts:
    # Imported here, as uvicorn and the app are in `start`: every `tessera` command loads this module.
    from tessera.platform.store.db import make_engine, migrate, session_factory

    settings = _settings(home, db)
    try:
        engine = make_engine(settings.db_url)
        migrate(engine)
    except ValueError as exc:
        fail(exc, code=2)
        raise   # not reached: fail() exits
    except Exception as exc:   # the database is unreachable or refused us: one line, not a traceback
        fail(f"cannot open the server database: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        raise   # not reached: fail() exits
    return Accounts(session_factory(engine))


@app.command("start")
def start(host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0: every interface)."),
          port: int = typer.Option(8080, min=1, max=65535, help="Port."),
          home: Path = typer.Option(None, "--home", help=HOME_HELP),
          db: str = typer.Option(None, "--db", help=DB_HELP),
          artifacts: str = typer.Option(None, "--artifacts", help=ARTIFACTS_HELP),
          lease_seconds: float = typer.Option(DEFAULT_LEASE_SECONDS, "--lease-seconds", min=0.5, max=3600,
                                              help=LEASE_HELP),
          log_level: str = typer.Option("warning", "--log-level", help="uvicorn's log level (info: every request).")
          ) -> None:
    """Serve the API (/api/v1) and the web console (/) until interrupted."""
    import uvicorn

    from tessera.platform.clusters.environment import withhold_server_credentials
    from tessera.platform.server.app import create_app
    from tessera.platform.store.db import safe_url

    withhold_server_credentials()   # the replica's bucket keys stay out of the runs it launches
    settings = _settings(home, db, host=host, port=port, artifacts=artifacts, lease_seconds=lease_seconds)
    try:
        application = create_app(settings)
    except ValueError as exc:
        fail(exc, code=2)
        raise   # not reached: fail() exits
    except PlatformError as exc:   # e.g. another secrets key than the store's: refused, in one line
        fail(f"cannot start the server: {exc}")
    except Exception as exc:
        fail(f"cannot start the server ({safe_url(settings.db_url)}): {type(exc).__name__}: "
             f"{str(exc).splitlines()[0] if str(exc) else ''}")
    _check_port(host, port)
    typer.echo(f"Tessera server on {settings.url}  (console: {settings.url}/, API: {settings.url}/api/v1, "
               f"home {settings.home}, database {safe_url(settings.db_url)}, artifacts {settings.artifacts_url})")
    sys.stdout.flush()
    # Followers of a quiet run's logs would otherwise hold a stop (Ctrl-C) until their runs end.
    config = uvicorn.Config(application, host=host, port=port, log_level=log_level.lower(),
                            timeout_graceful_shutdown=GRACEFUL_STOP)
    logging.getLogger("uvicorn.access").addFilter(_HideKeys())
    uvicorn.Server(config).run()


@app.command("migrate")
def migrate_store(home: Path = typer.Option(None, "--home", help=HOME_HELP),
                  db: str = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """Bring the database to the newest schema and import what an older version kept in the server home
    (each team's state.db and secret files), as `start` does; safe to run again (nothing is imported twice)."""
    from tessera.platform.secrets.vault import claim_secrets_key
    from tessera.platform.server.teams import TeamPlatforms, use_server_secret_key
    from tessera.platform.store.db import make_engine, migrate, safe_url

    settings = _settings(home, db)
    try:
        engine = make_engine(settings.db_url)
        migrate(engine)
        use_server_secret_key(settings.home)
        claim_secrets_key(engine, settings.home)
        imported = TeamPlatforms(engine, settings.home, artifacts_url=settings.artifacts_url).import_old_homes()
    except (PlatformError, ValueError, OSError) as exc:
        fail(f"cannot migrate {safe_url(settings.db_url)}: {exc}")
        raise   # not reached: fail() exits
    except SQLAlchemyError as exc:
        fail(f"the server database failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        raise   # not reached: fail() exits
    for team, runs in imported.items():
        typer.echo(f"team {team}: {runs} run(s) imported from {settings.home / 'teams' / team / 'state.db'}")
    typer.echo(f"{safe_url(settings.db_url)} is at the newest schema"
               + ("" if imported else f"; nothing to import from {settings.home}"))


@admin.command("create-team")
def create_team(name: str, home: Path = typer.Option(None, "--home", help=HOME_HELP),
                db: str = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """Create a team (its own runs, clusters and secrets)."""
    _act(lambda: _accounts(home, db).create_team(name))
    err.print(f"created team {name}")


@admin.command("create-user")
def create_user(name: str, team: str = typer.Option(..., "--team", help="The user's team (created if missing)."),
                is_admin: bool = typer.Option(False, "--admin", help="May create users and keys through the API."),
                home: Path = typer.Option(None, "--home", help=HOME_HELP),
                db: str = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """Create a user; prints their API key on stdout, alone (`KEY=$(tessera server admin create-user ...)`)."""
    key = _act(lambda: _accounts(home, db).create_user(name, team, admin=is_admin))
    typer.echo(key)
    err.print(f"created user {name} in team {team}{' (admin)' if is_admin else ''}; the API key above is shown "
              "only this once")


@admin.command("new-key")
def new_key(user: str, home: Path = typer.Option(None, "--home", help=HOME_HELP),
            db: str = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """Another API key for a user (printed alone on stdout, once); the old ones stay valid until revoked."""
    key = _act(lambda: _accounts(home, db).new_key(user))
    typer.echo(key)
    err.print(f"new API key for {user} (prefix {key[:12]}); shown only this once")


@admin.command("revoke-key")
def revoke_key(prefix: str = typer.Argument(..., help="The key's first 12 characters (see list-users)."),
               home: Path = typer.Option(None, "--home", help=HOME_HELP),
               db: str = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """Revoke an API key; requests with it get 401 from then on."""
    user = _act(lambda: _accounts(home, db).revoke_key(prefix))
    err.print(f"revoked key {prefix} of {user}")


@admin.command("list-users")
def list_users(home: Path = typer.Option(None, "--home", help=HOME_HELP),
               db: str = typer.Option(None, "--db", help=DB_HELP),
               as_json: bool = typer.Option(False, "--json", help="One JSON list."),
               wide: bool = WIDE, fmt: str = FORMAT) -> None:
    """Users, their teams and the prefixes of their valid keys."""
    fmt = output_format(fmt, as_json)
    users = _act(lambda: _accounts(home, db).list_users())
    if fmt == "json":
        typer.echo(json.dumps([u.__dict__ for u in users]))
        return
    print_list(USER_COLUMNS, users, lambda u: (u.name, u.team, "yes" if u.admin else "no", ", ".join(u.keys)),
               fmt, wide, empty="no users yet: tessera server admin create-user NAME --team TEAM")


class _HideKeys(logging.Filter):
    """Access-log lines show each path with its query: the console's `/?api_key=K` must not put K in a log
    (nor K URL-encoded, `tsk%5F...`: the mask is the run logs' one, redaction.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(hide_api_keys(a) if isinstance(a, str) else a for a in record.args)
        return True


def _check_port(host: str, port: int) -> None:
    """Fail in one line if the address is taken (uvicorn would log it and exit 3)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another server? choose --port)")


def _act(action: Callable[[], T]) -> T:
    """Run an account action; a refused one (exists, unknown, bad name) is a usage error, a database that
    fails is a runtime one (one line, no traceback)."""
    try:
        return action()
    except (PlatformError, ValueError) as exc:
        fail(exc, code=2)
        raise   # not reached: fail() exits
    except SQLAlchemyError as exc:
        fail(f"the server database failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        raise   # not reached: fail() exits


if __name__ == "__main__":   # `python -m tessera.cli.server start`: the server without the other commands' imports
    app()
