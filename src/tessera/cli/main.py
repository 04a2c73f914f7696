"""The `tessera` command. Each layer adds its sub-command group here."""

from __future__ import annotations

import typer

from tessera import __version__
from tessera.cli import console
from tessera.cli.cluster import app as cluster_app
from tessera.cli.data import app as data_app
from tessera.cli.distributed_launch import CONTEXT as LAUNCH_CONTEXT
from tessera.cli.distributed_launch import launch
from tessera.cli.llm import app as llm_app
from tessera.cli.login import login, logout
from tessera.cli.run import app as run_app
from tessera.cli.secret import app as secret_app
from tessera.cli.server import app as server_app
from tessera.cli.storage import app as storage_app
from tessera.cli.train import train

app = typer.Typer(help="Tessera: train models on any compute, with data and checkpoints in object storage.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(storage_app, name="storage")
app.add_typer(data_app, name="data")
app.add_typer(run_app, name="run")
app.add_typer(cluster_app, name="cluster")
app.add_typer(secret_app, name="secret")
app.add_typer(server_app, name="server")
app.command("launch", context_settings=LAUNCH_CONTEXT)(launch)
app.add_typer(llm_app, name="llm")
app.command("train")(train)
app.command("login")(login)
app.command("logout")(logout)


@app.callback(invoke_without_command=True)
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit."),
          debug: bool = typer.Option(False, "--debug", help="On an error, show the Python traceback "
                                                             "(any sub-command).")) -> None:
    console.debug_all = debug
    if version:
        typer.echo(__version__)
        raise typer.Exit()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
