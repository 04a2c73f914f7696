"""`tessera secret create s3|env|file`, `secret list`, `secret remove`. Values are never printed."""

from __future__ import annotations

import os
import sys
import time

import typer
from rich.table import Table

from tessera.cli.console import err, fail, out
from tessera.platform import SecretError
from tessera.platform.secret_input import (
    merge_values,
    parse_env_lines,
    values_from_arguments,
    values_from_environ,
    values_from_files,
)
from tessera.platform.secrets import SecretStore, secret_json

app = typer.Typer(help="Store credentials for runs (mode 0600 under TESSERA_HOME); values are never shown.",
                  no_args_is_help=True)
create = typer.Typer(help="Create a secret: s3 credentials, env variables, or a file.", no_args_is_help=True)
app.add_typer(create, name="create")


@create.command("s3")
def create_s3(name: str,
              access_key_id: str = typer.Option(None, "--access-key-id",
                                                help="Access key id (with --from-env: default $AWS_ACCESS_KEY_ID)."),
              from_env: bool = typer.Option(False, "--from-env",
                                            help="Take AWS_SECRET_ACCESS_KEY (and AWS_ACCESS_KEY_ID, S3_ENDPOINT_URL, "
                                                 "AWS_REGION unless given) from this shell's environment."),
              from_file: str = typer.Option(None, "--from-file", metavar="PATH",
                                            help="Read the secret access key from a file."),
              stdin: bool = typer.Option(False, "--stdin", help="Read the secret access key from stdin."),
              secret_access_key: str = typer.Option(None, "--secret-access-key",
                                                    help="Deprecated: a value on the command line ends up in shell "
                                                         "history and in `ps`."),
              endpoint: str = typer.Option(None, help="Endpoint URL for S3-compatible stores (R2, MinIO, ...)."),
              region: str = typer.Option(None, help="Region."),
              overwrite: bool = typer.Option(False, "--overwrite", help="Replace a secret of the same name.")) -> None:
    """S3 credentials, injected as AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, S3_ENDPOINT_URL, AWS_REGION.

    The secret key comes from --from-env, --from-file or --stdin (prompted for on a terminal without them):
    `tessera secret create s3 store --from-env`, or `... --access-key-id AKIA... --stdin < key.txt`."""
    sources = [flag for flag, given in (("--from-env", from_env), ("--from-file", from_file), ("--stdin", stdin),
                                        ("--secret-access-key", secret_access_key)) if given]
    if len(sources) > 1:
        raise typer.BadParameter(f"give the secret access key one way, not {' and '.join(sources)}",
                                 param_hint="--from-env / --from-file / --stdin")
    if secret_access_key:
        err.print("[yellow]warning:[/yellow] --secret-access-key VALUE is kept in shell history and visible to "
                  "other users in `ps`; use --from-env, --from-file or --stdin", soft_wrap=True)
    try:
        if from_env:
            secret_access_key = values_from_environ(["AWS_SECRET_ACCESS_KEY"], os.environ)["AWS_SECRET_ACCESS_KEY"]
            access_key_id = access_key_id or os.environ.get("AWS_ACCESS_KEY_ID")
            endpoint = endpoint or os.environ.get("S3_ENDPOINT_URL")
            region = region or os.environ.get("AWS_REGION")
        elif from_file:
            secret_access_key = values_from_files([f"AWS_SECRET_ACCESS_KEY={from_file}"])["AWS_SECRET_ACCESS_KEY"]
        elif stdin:
            secret_access_key = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
        elif not secret_access_key:
            if not sys.stdin.isatty():
                raise typer.BadParameter("give the secret access key with --from-env, --from-file PATH or --stdin",
                                         param_hint="--from-env / --from-file / --stdin")
            secret_access_key = typer.prompt("Secret access key", hide_input=True)
        if not access_key_id:
            raise typer.BadParameter("missing: give it, or set AWS_ACCESS_KEY_ID and pass --from-env",
                                     param_hint="--access-key-id")
        if not secret_access_key:
            raise SecretError(f"secret {name}: the secret access key is empty")
        SecretStore().create_s3(name, access_key_id, secret_access_key, endpoint, region, overwrite=overwrite)
    except SecretError as exc:
        fail(exc)
    err.print(f"created secret {name} (s3)")


@create.command("env")
def create_env(name: str,
               pairs: list[str] = typer.Argument(None, metavar="[KEY=VALUE...]",
                                                 help="Deprecated: values on the command line end up in shell "
                                                      "history and in `ps`."),
               from_env: list[str] = typer.Option([], "--from-env", metavar="KEY[=VAR]",
                                                  help="Take KEY's value from $VAR (default $KEY) here."),
               from_file: list[str] = typer.Option([], "--from-file", metavar="KEY=PATH",
                                                   help="Take KEY's value from a file (one trailing newline dropped)."),
               stdin: bool = typer.Option(False, "--stdin", help="Read KEY=VALUE lines from stdin."),
               overwrite: bool = typer.Option(False, "--overwrite", help="Replace a secret of the same name.")) -> None:
    """Environment variables, injected as they are. Values come from --from-env, --from-file or --stdin:

    `tessera secret create env wandb --from-env WANDB_API_KEY`, or `... --stdin < keys.env`."""
    if not (pairs or from_env or from_file or stdin):
        raise typer.BadParameter("give values with --from-env KEY, --from-file KEY=PATH or --stdin",
                                 param_hint="KEY=VALUE")
    try:
        inline = values_from_arguments(pairs or [])
        if inline:
            err.print("[yellow]warning:[/yellow] values given as KEY=VALUE arguments are kept in shell history "
                      "and visible to other users in `ps`; use --from-env, --from-file or --stdin", soft_wrap=True)
        values = merge_values(inline, values_from_environ(from_env, os.environ), values_from_files(from_file),
                              parse_env_lines(sys.stdin.read(), "stdin") if stdin else {})
        if not values:
            raise SecretError("no KEY=VALUE given (stdin held none)")
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


