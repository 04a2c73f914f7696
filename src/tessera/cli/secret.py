"""`tessera secret create TYPE NAME ...`, `secret list`, `secret remove`: MCLI's secret types.

Values come from a file, stdin, this shell's environment or a hidden prompt, never from the command
line (shell history, `ps`); only the old `env KEY=VALUE` and `s3 --secret-access-key` forms remain, with a
warning. Commands talk to `connect()`: the team's server when one is configured, else this machine's
encrypted store. Values are never printed.
"""

from __future__ import annotations

import base64
import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer

from tessera.cli.console import err, fail
from tessera.cli.output import FORMAT, WIDE, Column, output_format, print_list, short_time
from tessera.platform.api.connection import connect
from tessera.platform.errors import PlatformError
from tessera.platform.secrets.input import (
    content_from_file,
    merge_values,
    parse_env_lines,
    read_limited,
    value_from_sources,
    values_from_arguments,
    values_from_environ,
    values_from_files,
)
from tessera.platform.secrets.types import DOCKER_HUB
from tessera.platform.secrets.vault import SecretInfo, SecretInputError, secret_json

app = typer.Typer(help="Store credentials for runs (encrypted at rest); values are never shown.",
                  no_args_is_help=True)
create = typer.Typer(help="Create a secret: s3, env, file, mounted, ssh, git-ssh, gcp, docker-registry, azure.",
                     no_args_is_help=True)
app.add_typer(create, name="create")

# What `secret list` shows: the name whole; what a secret exposes is cut first when the line is too long.
SECRET_COLUMNS = (Column("NAME", 0), Column("TYPE", 1), Column("CREATED", 3), Column("EXPOSES", 2, min_width=12))
OVERWRITE = typer.Option(False, "--overwrite", help="Replace a secret of the same name.")
STDIN = typer.Option(False, "--stdin", help="Read the value from stdin.")
FROM_FILE = typer.Option(None, "--from-file", metavar="PATH", help="Read the value from a file.")
FROM_ENV = typer.Option(None, "--from-env", metavar="VAR", help="Take the value from $VAR of this shell.")
MOUNT_DIR = typer.Option(None, "--mount-path", metavar="DIR",
                         help="Containers: the folder the file is mounted in (default /secrets/NAME).")


def _one_line(command: Callable[..., None]) -> Callable[..., None]:
    """A command whose failures are one line: exit 2 for bad input, 1 for anything that failed after."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except SecretInputError as exc:
            fail(exc, code=2)
        except PlatformError as exc:
            fail(exc)
    return run


@contextmanager
def _platform() -> Iterator[Any]:
    """The platform `connect()` picks (a server, or this machine's store), closed after the command."""
    platform = connect()
    try:
        yield platform
    finally:
        platform.close()


def _create(type_: str, name: str, overwrite: bool, **fields: Any) -> None:
    """Store the secret; file contents travel as base64 (the same for the local store and a server)."""
    fields = {k: base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else v for k, v in fields.items()}
    with _platform() as platform:
        info: SecretInfo = platform.secrets.create(type_, name, overwrite=overwrite, **fields)
    err.print(f"created secret {name} ({type_}: {', '.join(info.exposes)})", soft_wrap=True)


def _value(what: str, path: str | None = None, env_var: str | None = None, stdin: bool = False) -> str:
    """A password or key from --from-file, --from-env or --stdin, else a hidden prompt on a terminal."""
    value = value_from_sources(what, path=path, env_var=env_var, stdin=sys.stdin.buffer if stdin else None,
                               environ=os.environ)
    if value is None and sys.stdin.isatty():
        value = typer.prompt(what.capitalize(), hide_input=True)
    if value is None:
        raise SecretInputError(f"give the {what} with --from-file PATH, --from-env VAR or --stdin")
    if not value:
        raise SecretInputError(f"the {what} is empty")
    return value


def _content(what: str, path: str | None, stdin: bool, prompt: bool = False) -> bytes:
    """A file's bytes from PATH or stdin (or, for `mounted`, a hidden prompt on a terminal)."""
    if path and stdin:
        raise SecretInputError(f"give the {what} one way: a file or --stdin, not both")
    if path:
        return content_from_file(path, what)
    if stdin:
        return read_limited(sys.stdin.buffer, "stdin")
    if prompt and sys.stdin.isatty():
        return typer.prompt(what.capitalize(), hide_input=True).encode()
    raise SecretInputError(f"give the {what} as a file path or with --stdin")


@create.command("s3")
@_one_line
def create_s3(name: str,
              credentials_file: str = typer.Option(None, "--credentials-file", metavar="PATH",
                                                   help="An AWS credentials file (as MCLI; `aws configure` writes one)."),
              config_file: str = typer.Option(None, "--config-file", metavar="PATH", help="An AWS config file."),
              access_key_id: str = typer.Option(None, "--access-key-id",
                                                help="Access key id (with --from-env: default $AWS_ACCESS_KEY_ID)."),
              from_env: bool = typer.Option(False, "--from-env",
                                            help="Take AWS_SECRET_ACCESS_KEY (and AWS_ACCESS_KEY_ID, S3_ENDPOINT_URL, "
                                                 "AWS_REGION unless given) from this shell's environment."),
              from_file: str = FROM_FILE, stdin: bool = STDIN,
              secret_access_key: str = typer.Option(None, "--secret-access-key",
                                                    help="Deprecated: a value on the command line ends up in shell "
                                                         "history and in `ps`."),
              endpoint: str = typer.Option(None, help="Endpoint URL for S3-compatible stores (R2, MinIO, ...)."),
              region: str = typer.Option(None, help="Region."), overwrite: bool = OVERWRITE) -> None:
    """S3 credentials: mounted as credentials/config files (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE)
    and set as AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, S3_ENDPOINT_URL, AWS_REGION.

    `tessera secret create s3 r2 --credentials-file ~/.r2/credentials --endpoint URL`, or
    `... --access-key-id AKIA... --stdin < key.txt`, or `... --from-env`."""
    if secret_access_key and (from_env or from_file or stdin):
        raise SecretInputError("give the secret access key one way: --secret-access-key or --from-env, "
                               "--from-file, --stdin")
    if secret_access_key:
        err.print("[yellow]warning:[/yellow] --secret-access-key VALUE is kept in shell history and visible to "
                  "other users in `ps`; use --from-env, --from-file or --stdin", soft_wrap=True)
    if from_env:
        access_key_id = access_key_id or os.environ.get("AWS_ACCESS_KEY_ID")
        endpoint = endpoint or os.environ.get("S3_ENDPOINT_URL")
        region = region or os.environ.get("AWS_REGION")
    fields: dict[str, Any] = {"endpoint": endpoint, "region": region}
    if credentials_file:
        fields["credentials"] = _content("credentials", credentials_file, False)
    if config_file:
        fields["config"] = _content("config", config_file, False)
    if not credentials_file or access_key_id or secret_access_key or from_env or from_file or stdin:
        if not access_key_id:
            raise SecretInputError("give --access-key-id, or set AWS_ACCESS_KEY_ID and pass --from-env, or give "
                                   "--credentials-file")
        fields["access_key_id"] = access_key_id
        fields["secret_access_key"] = secret_access_key or _value(
            "secret access key", from_file, "AWS_SECRET_ACCESS_KEY" if from_env else None, stdin)
    _create("s3", name, overwrite, **fields)


@create.command("env")
@_one_line
def create_env(name: str,
               pairs: list[str] = typer.Argument(None, metavar="[KEY=VALUE...]",
                                                 help="Deprecated: values on the command line end up in shell "
                                                      "history and in `ps`."),
               from_env: list[str] = typer.Option([], "--from-env", metavar="KEY[=VAR]",
                                                  help="Take KEY's value from $VAR (default $KEY) here."),
               from_file: list[str] = typer.Option([], "--from-file", metavar="KEY=PATH",
                                                   help="Take KEY's value from a file (one trailing newline dropped)."),
               stdin: bool = typer.Option(False, "--stdin", help="Read KEY=VALUE lines from stdin."),
               overwrite: bool = OVERWRITE) -> None:
    """Environment variables, injected as they are. Values come from --from-env, --from-file or --stdin:

    `tessera secret create env wandb --from-env WANDB_API_KEY`, or `... --stdin < keys.env`."""
    if not (pairs or from_env or from_file or stdin):
        raise SecretInputError("give values with --from-env KEY, --from-file KEY=PATH or --stdin (KEY=VALUE lines)")
    inline = values_from_arguments(pairs or [])
    if inline:
        err.print("[yellow]warning:[/yellow] values given as KEY=VALUE arguments are kept in shell history "
                  "and visible to other users in `ps`; use --from-env, --from-file or --stdin", soft_wrap=True)
    values = merge_values(inline, values_from_environ(from_env, os.environ), values_from_files(from_file),
                          parse_env_lines(sys.stdin.read(), "stdin") if stdin else {})
    if not values:
        raise SecretInputError("no KEY=VALUE given (stdin held none)")
    _create("env", name, overwrite, values=values)


@create.command("file")
@_one_line
def create_file(name: str, path: str,
                env_var: str = typer.Option(None, "--env-var", help="Variable that names the file in the run "
                                            "(default TESSERA_SECRET_<NAME>)."),
                mount_path: str = typer.Option(None, "--mount-path", help="Containers: the file's path."),
                overwrite: bool = OVERWRITE) -> None:
    """A file (a key, a credentials file), handed to runs by path in --env-var."""
    with _platform() as platform:
        info = platform.secrets.create_file(name, path, env_var, mount_path, overwrite=overwrite)
    err.print(f"created secret {name} (file: {', '.join(info.exposes)})")


@create.command("mounted")
@_one_line
def create_mounted(name: str, path: str = typer.Argument(None, metavar="[PATH]", help="A file with the value."),
                   stdin: bool = STDIN, mount_path: str = MOUNT_DIR, overwrite: bool = OVERWRITE) -> None:
    """A value mounted as a file (as MCLI): its path is in $SECRET_PATH_<NAME>. Asked for when not given."""
    _create("mounted", name, overwrite, content=_content("value", path, stdin, prompt=True), mount_path=mount_path)


def _ssh(type_: str, name: str, path: str | None, stdin: bool, mount_path: str | None, overwrite: bool) -> None:
    _create(type_, name, overwrite, content=_content("SSH private key", path, stdin), mount_path=mount_path)


KEY_PATH = typer.Argument(None, metavar="[KEY_FILE]", help="The private key (no passphrase), e.g. ~/.ssh/id_ed25519.")


@create.command("ssh")
@_one_line
def create_ssh(name: str, path: str = KEY_PATH, stdin: bool = STDIN, mount_path: str = MOUNT_DIR,
               overwrite: bool = OVERWRITE) -> None:
    """An SSH private key, mounted as a file: its path is in $SECRET_PATH_<NAME>."""
    _ssh("ssh", name, path, stdin, mount_path, overwrite)


@create.command("git-ssh")
@_one_line
def create_git_ssh(name: str, path: str = KEY_PATH, stdin: bool = STDIN, mount_path: str = MOUNT_DIR,
                   overwrite: bool = OVERWRITE) -> None:
    """An SSH key for git: mounted as `ssh`, and GIT_SSH_COMMAND uses it (git_repo integrations, ssh_clone)."""
    _ssh("git-ssh", name, path, stdin, mount_path, overwrite)


@create.command("gcp")
@_one_line
def create_gcp(name: str,
               credentials_file: str = typer.Option(None, "--credentials-file", metavar="PATH",
                                                    help="A service-account key JSON file."),
               stdin: bool = STDIN, mount_path: str = MOUNT_DIR, overwrite: bool = OVERWRITE) -> None:
    """GCP service-account credentials, mounted as a file named by GOOGLE_APPLICATION_CREDENTIALS."""
    _create("gcp", name, overwrite, content=_content("GCP credentials", credentials_file, stdin),
            mount_path=mount_path)


@create.command("docker-registry")
@_one_line
def create_docker_registry(name: str, username: str = typer.Option(..., "--username", help="Registry user name."),
                           server: str = typer.Option(DOCKER_HUB, "--server", help="Registry address."),
                           email: str = typer.Option(None, "--email", help="E-mail (some registries want it)."),
                           password_file: str = typer.Option(None, "--password-file", metavar="PATH",
                                                             help="Read the password (or token) from a file."),
                           password_stdin: bool = typer.Option(False, "--password-stdin", "--stdin",
                                                               help="Read the password (or token) from stdin."),
                           from_env: str = FROM_ENV, overwrite: bool = OVERWRITE) -> None:
    """Registry credentials as a Docker config.json: DOCKER_CONFIG names its folder (MCLI's `docker`)."""
    password = _value("registry password", password_file, from_env, password_stdin)
    _create("docker-registry", name, overwrite, username=username, password=password, server=server, email=email)


create.command("docker", hidden=True, help="Alias of docker-registry (MCLI's name).")(create_docker_registry)


@create.command("azure")
@_one_line
def create_azure(name: str, account_name: str = typer.Option(..., "--account-name", help="Storage account name."),
                 from_file: str = FROM_FILE, from_env: str = FROM_ENV, stdin: bool = STDIN,
                 overwrite: bool = OVERWRITE) -> None:
    """Azure storage credentials: AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_ACCESS_KEY (and the az CLI's names)."""
    key = _value("account access key", from_file, from_env, stdin)
    _create("azure", name, overwrite, account_name=account_name, account_key=key)


@app.command("list")
@_one_line
def list_(as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
          wide: bool = WIDE, fmt: str = FORMAT) -> None:
    """Names, types, creation times and what each secret exposes: never values."""
    fmt = output_format(fmt, as_json)
    with _platform() as platform:
        infos = platform.secrets.list()
    print_list(SECRET_COLUMNS, infos, lambda info: (info.name, info.type, short_time(info.created),
                                                    ", ".join(info.exposes)), fmt, wide, as_json=secret_json,
               empty="no secrets yet: tessera secret create TYPE NAME ...")


@app.command("remove")
@_one_line
def remove(name: str) -> None:
    """Delete a secret."""
    with _platform() as platform:
        platform.secrets.remove(name)
    err.print(f"removed secret {name}")
