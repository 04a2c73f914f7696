"""`tessera secret create s3|env|file`, `secret list`, `secret remove`. Values are never printed."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from tessera.cli.console import err, fail, out
from tessera.platform import SecretError
from tessera.platform.secrets import SecretStore, secret_json

app = typer.Typer(help="Store credentials for runs (mode 0600 under TESSERA_HOME); values are never shown.",
                  no_args_is_help=True)
create = typer.Typer(help="Create a secret: s3 credentials, env variables, or a file.", no_args_is_help=True)
app.add_typer(create, name="create")


@create.command("s3")
def create_s3(name: str,
              access_key_id: str = typer.Option(..., "--access-key-id", help="Access key id."),
              secret_access_key: str = typer.Option(..., "--secret-access-key", prompt=True, hide_input=True,
                                                    help="Secret access key (prompted for if absent)."),
              endpoint: str = typer.Option(None, help="Endpoint URL for S3-compatible stores (R2, MinIO, ...)."),
              region: str = typer.Option(None, help="Region."),
              overwrite: bool = typer.Option(False, "--overwrite", help="Replace a secret of the same name.")) -> None:
    """S3 credentials, injected as AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, S3_ENDPOINT_URL, AWS_REGION."""
    try:
        SecretStore().create_s3(name, access_key_id, secret_access_key, endpoint, region, overwrite=overwrite)
    except SecretError as exc:
        fail(exc)
    err.print(f"created secret {name} (s3)")


@create.command("env")
def create_env(name: str, pairs: list[str] = typer.Argument(..., metavar="KEY=VALUE..."),
               overwrite: bool = typer.Option(False, "--overwrite", help="Replace a secret of the same name.")) -> None:
    """Environment variables, injected as they are."""
    values = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(SecretError(f"expected KEY=VALUE, got an argument without '=' (argument {len(values) + 1})"))
        values[key] = value
    try:
        SecretStore().create_env(name, values, overwrite=overwrite)
    except SecretError as exc:
        fail(exc)
    err.print(f"created secret {name} (env: {', '.join(sorted(values))})")


@create.command("file")
def create_file(name: str, path: str,
                env_var: str = typer.Option(None, "--env-var", help="Variable that names the file in the run "
                                            "(default TESSERA_SECRET_<NAME>)."),
                mount_path: str = typer.Option(None, "--mount-path", help="Kubernetes: where to mount the file."),
                overwrite: bool = typer.Option(False, "--overwrite", help="Replace a secret of the same name.")) -> None:
    """A file (a key, a credentials file), handed to runs by path."""
    try:
        info = SecretStore().create_file(name, path, env_var, mount_path, overwrite=overwrite)
    except SecretError as exc:
        fail(exc)
    err.print(f"created secret {name} (file: {', '.join(info.exposes)})")


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="One JSON object per line.")) -> None:
    """Names, types and what each secret exposes: never values."""
    infos = SecretStore().list()
    if as_json:
        for info in infos:
            typer.echo(secret_json(info))
        return
    table = Table("NAME", "TYPE", "EXPOSES", "CREATED")
    for info in infos:
        table.add_row(info.name, info.type, ", ".join(info.exposes),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(info.created)))
    out.print(table)


@app.command("remove")
def remove(name: str) -> None:
    """Delete a secret."""
    try:
        SecretStore().remove(name)
    except SecretError as exc:
        fail(exc)
    err.print(f"removed secret {name}")


