"""`tessera run submit|list|describe|logs|stop|restart|move|delete|update|clone|convert`: runs on any
cluster, kept alive by the supervisor. Every command works on the platform `connect()` picks (a team's
server when TESSERA_API_URL or `tessera login` names one, this machine otherwise), with the same output."""

from __future__ import annotations

import json
import secrets
import sys
from typing import Any

import typer
import yaml

from tessera.cli.console import err, fail
from tessera.cli.describe import describe_run
from tessera.cli.output import FORMAT, STATE_STYLES, WIDE, Column, output_format, print_list, short_time
from tessera.cli.run_metrics import metrics
from tessera.platform import Platform, PlatformError, RunExists, RunStateError, SpecError
from tessera.platform.api.client import RemotePlatform
from tessera.platform.api.connection import connect
from tessera.platform.spec.run_spec import format_duration
from tessera.syntax_errors import yaml_error

app = typer.Typer(help="Submit runs and watch, stop, restart, move, clone or delete them.", no_args_is_help=True)
AnyPlatform = Platform | RemotePlatform
# What `run list` shows, most important first after the name: what state, when, where, whose.
RUN_COLUMNS = (Column("NAME", 0), Column("STATUS", 1, styles=STATE_STYLES), Column("CLUSTER", 3, min_width=7),
               Column("USER", 4, min_width=6), Column("GPUS", 6), Column("NODES", 7), Column("RESUMPTIONS", 5),
               Column("CREATED", 2))


def _platform() -> AnyPlatform:
    try:
        return connect()
    except PlatformError as exc:
        fail(exc)
        raise   # not reached: fail() exits


def _follow(platform: AnyPlatform, name: str, rank: int | None = None, resumption: int | None = None,
            follow: bool = True) -> None:
    try:
        for line in platform.follow_logs(name, rank, resumption, follow):
            typer.echo(line)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command("submit")
def submit(file: str = typer.Option(..., "-f", "--file", help="Run spec YAML."),
           cluster: str = typer.Option(None, "--cluster", help="Cluster (overrides compute.cluster)."),
           follow: bool = typer.Option(False, "--follow", help="Follow the logs until the run ends."),
           as_json: bool = typer.Option(False, "--json", help="Print the run as JSON.")) -> None:
    """Validate a run spec and submit it; the supervisor starts and watches it."""
    platform = _platform()
    try:
        run = platform.create_run(file, cluster=cluster)
    except PlatformError as exc:   # an invalid spec is a usage error (2); a taken name, a conflict (1)
        fail(exc, code=2 if isinstance(exc, SpecError) and not isinstance(exc, RunExists | RunStateError) else 1)
    if as_json:
        typer.echo(json.dumps(platform.describe_run(run.name)))
    else:
        err.print(f"submitted run {run.name} (id {run.id}) to {run.cluster}")
    if follow:
        _follow(platform, run.name)
        final = platform.get_run(run.name)
        err.print(f"run {final.name}: {final.status}" + (f" ({final.first_error})" if final.first_error else ""))
        raise typer.Exit(0 if final.status == "COMPLETED" else 1)


def _summaries(platform: AnyPlatform, status: str | None, cluster: str | None, user: str | None,
               limit: int | None) -> list[dict[str, Any]]:
    """The rows `run list` shows (the same from the local platform and the server)."""
    return platform.run_summaries(status, cluster, limit, user=user)[0]


@app.command("list")
def list_(status: str = typer.Option(None, help="Only runs in this status (e.g. RUNNING)."),
          cluster: str = typer.Option(None, help="Only runs on this cluster."),
          user: str = typer.Option(None, help="Only runs this user submitted."),
          limit: int = typer.Option(None, min=1, help="At most this many (the newest)."),
          as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
          wide: bool = WIDE, fmt: str = FORMAT) -> None:
    """List runs, newest first. Names are never cut: other columns give way to fit the terminal."""
    fmt = output_format(fmt, as_json)
    platform = _platform()
    try:
        rows = _summaries(platform, status, cluster, user, limit)
    except (PlatformError, ValueError) as exc:
        fail(exc)
    print_list(RUN_COLUMNS, rows, lambda row: (
        row["name"], row["status"], row["cluster"], row.get("user"), row["gpus"], row["nodes"],
        row["resumptions"], short_time(row["created"])), fmt, wide,
        empty="no runs" + (" match" if status or cluster or user else " yet: tessera run submit -f RUN.yaml"))


@app.command("describe")
def describe(name: str, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """A run as YAML-like sections: state, spec, compute, scheduling, resumptions and their causes, where its
    checkpoints and logs are, and its latest events (secret values never appear; --json has everything)."""
    platform = _platform()
    try:
        info = platform.describe_run(name)
    except PlatformError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(info, indent=1))
        return
    typer.echo(describe_run(info), nl=False)


@app.command("logs")
def logs(name: str, follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines."),
         rank: int = typer.Option(None, "--rank", help="Only this global rank (default: every node)."),
         resumption: int = typer.Option(None, "--resumption", help="This resumption (default: the latest)."),
         ) -> None:
    """Print a run's logs (secret values are replaced by ****)."""
    platform = _platform()
    try:
        _follow(platform, name, rank, resumption, follow)
    except PlatformError as exc:
        fail(exc)


app.command("metrics")(metrics)   # cli/run_metrics.py: a table, JSON lines, or --plot curves


@app.command("stop")
def stop(name: str, wait: bool = typer.Option(False, "--wait", help="Wait until it has stopped.")) -> None:
    """Stop a run gracefully (SIGTERM, stop_grace, SIGKILL)."""
    platform = _platform()
    try:
        run = platform.stop_run(name)
        if wait:
            run = platform.wait_for_run_status(name, ("STOPPED", "COMPLETED", "FAILED"))
    except PlatformError as exc:
        fail(exc)
    err.print(f"run {run.name}: {run.status}" + ("" if run.done else " (stop requested)"))


@app.command("restart")
def restart(name: str, cluster: str = typer.Option(None, "--cluster", help="Restart on this cluster.")) -> None:
    """Start a finished run again, or stop and start an active one (a new resumption either way)."""
    try:
        run = _platform().restart_run(name, cluster)
    except PlatformError as exc:
        fail(exc)
    err.print(f"run {run.name}: restart requested ({run.status})")


@app.command("move")
def move(name: str, cluster: str = typer.Option(..., "--cluster", help="Target cluster."),
         follow: bool = typer.Option(False, "--follow", help="Follow the logs until the run ends.")) -> None:
    """Stop a run (it checkpoints on SIGTERM) and resume it on another cluster."""
    platform = _platform()
    try:
        run = platform.move_run(name, cluster)
    except PlatformError as exc:
        fail(exc)
    err.print(f"run {run.name}: moving from {run.cluster} to {cluster}")
    if follow:
        _follow(platform, name)


@app.command("delete")
def delete(name: str, yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")) -> None:
    """Delete a run: stop it if it is active, then remove its record, logs and folder."""
    if not yes:
        if not sys.stdin.isatty():
            fail(f"deleting run {name} removes its logs and folder: pass --yes to confirm", code=2)
        typer.confirm(f"Delete run {name}, its logs and its folder?", abort=True)
    try:
        _platform().delete_run(name)
    except PlatformError as exc:
        fail(exc)
    err.print(f"deleted run {name}")


@app.command("update")
def update(name: str,
           priority: str = typer.Option(None, help="low | normal | high."),
           max_duration: str = typer.Option(None, "--max-duration",
                                            help="Total running time over all resumptions (e.g. 12h, 1h30m)."),
           max_retries: int = typer.Option(None, "--max-retries", help="Retries after failures."),
           preemptible: bool = typer.Option(None, "--preemptible/--no-preemptible",
                                            help="May be stopped for other work (from its next submission)."),
           retry_on_system_failure: bool = typer.Option(
               None, "--retry-on-system-failure/--no-retry-on-system-failure",
               help="Retry node faults and preemptions without counting them.")) -> None:
    """Change a run's scheduling; the supervisor applies it to the running resumption too."""
    if all(v is None for v in (priority, max_duration, max_retries, preemptible, retry_on_system_failure)):
        fail("nothing to update: give --priority, --max-duration, --max-retries, --[no-]preemptible or "
             "--[no-]retry-on-system-failure", code=2)
    try:
        run = _platform().update_run(name, priority=priority, max_duration=max_duration, max_retries=max_retries,
                                     preemptible=preemptible, retry_on_system_failure=retry_on_system_failure)
    except PlatformError as exc:
        fail(exc)
    sched = run.spec.scheduling
    err.print(f"run {run.name}: priority={sched.priority}, max_duration={format_duration(sched.max_duration)}, "
              f"max_retries={sched.max_retries}, preemptible={sched.preemptible}, "
              f"retry_on_system_failure={sched.retry_on_system_failure}")


def clone_name(name: str) -> str:
    """NAME-clone-<4 hex>, NAME shortened so the result is still a valid (63-character) run name."""
    suffix = f"-clone-{secrets.token_hex(2)}"
    return name[:63 - len(suffix)] + suffix


@app.command("clone")
def clone(name: str,
          new_name: str = typer.Option(None, "--name", help="The clone's name (default NAME-clone-XXXX)."),
          cluster: str = typer.Option(None, "--cluster", help="Run the clone on this cluster."),
          gpus: int = typer.Option(None, "--gpus", min=0, help="GPUs per node of the clone."),
          follow: bool = typer.Option(False, "--follow", help="Follow the clone's logs until it ends.")) -> None:
    """Submit a run's spec again under a new name (optionally on another cluster or GPU count)."""
    platform = _platform()
    try:
        run = platform.clone_run(name, new_name or clone_name(name), cluster=cluster, gpus=gpus)
    except PlatformError as exc:
        fail(exc)
    err.print(f"submitted run {run.name} (id {run.id}), a clone of {name}, to {run.cluster}")
    if follow:
        _follow(platform, run.name)


@app.command("convert")
def convert(file: str = typer.Argument(..., help="An MCLI run YAML.")) -> None:
    """Print the Tessera run spec an MCLI run YAML becomes (what `run submit -f FILE` runs)."""
    from tessera.platform.spec.mcli import to_run_spec

    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
        data = yaml.safe_load(text)
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror or exc}", code=2)
    except yaml.YAMLError as exc:
        fail(yaml_error(exc, text, file), code=2)
    if not isinstance(data, dict):
        fail(f"{file}: expected a mapping of MCLI keys (run_name, command, compute, ...)", code=2)
    try:
        spec = to_run_spec(data, source=file)
    except PlatformError as exc:
        fail(exc)
    typer.echo(spec.to_yaml(), nl=False)
