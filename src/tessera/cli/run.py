"""`tessera run submit|list|describe|logs|stop|restart|move`: runs on any cluster, kept alive by the
supervisor."""

from __future__ import annotations

import json
import time

import typer
from rich.table import Table

from tessera.cli.console import err, fail, out
from tessera.platform import Platform, PlatformError
from tessera.platform.spec import format_duration

app = typer.Typer(help="Submit runs and watch, stop, restart or move them.", no_args_is_help=True)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _follow(platform: Platform, name: str, rank: int | None = None, resumption: int | None = None,
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
    platform = Platform()
    try:
        run = platform.create_run(file, cluster=cluster)
    except PlatformError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(platform.describe_run(run.name)))
    else:
        err.print(f"submitted run {run.name} (id {run.id}) to {run.cluster}")
    if follow:
        _follow(platform, run.name)
        final = platform.get_run(run.name)
        err.print(f"run {final.name}: {final.status}" + (f" ({final.first_error})" if final.first_error else ""))
        raise typer.Exit(0 if final.status == "COMPLETED" else 1)


@app.command("list")
def list_(status: str = typer.Option(None, help="Only runs in this status (e.g. RUNNING)."),
          cluster: str = typer.Option(None, help="Only runs on this cluster."),
          as_json: bool = typer.Option(False, "--json", help="One JSON object per line.")) -> None:
    """List runs, newest first."""
    platform = Platform()
    try:
        runs = platform.list_runs(status, cluster)
    except (PlatformError, ValueError) as exc:
        fail(exc)
    if as_json:
        for run in runs:
            typer.echo(json.dumps({"name": run.name, "id": run.id, "status": run.status, "cluster": run.cluster,
                                   "created": run.created, "resumptions": len(run.resumptions)}))
        return
    table = Table("NAME", "STATUS", "CLUSTER", "RESUMPTIONS", "CREATED")
    for run in runs:
        table.add_row(run.name, run.status, run.cluster, str(len(run.resumptions)), _when(run.created))
    out.print(table)


@app.command("describe")
def describe(name: str, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Config, resumptions, events and the first error of a run (secret values never appear)."""
    platform = Platform()
    try:
        info = platform.describe_run(name)
    except PlatformError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(info, indent=1))
        return
    out.print(f"[bold]{info['name']}[/bold] ({info['id']}): {info['status']} on {info['cluster']}")
    if info.get("first_error"):
        out.print(f"[red]first error[/red] ({info.get('failure_kind')}): {info['first_error']}", markup=True)
    spec = info["spec"]
    sched = spec["scheduling"]
    out.print(f"command: {spec['command']}")
    out.print(f"compute: {spec['compute']}")
    out.print(f"secrets: {', '.join(spec['secrets']) or '-'}   env: {', '.join(spec['env']) or '-'}")
    out.print(f"scheduling: max_retries={sched['max_retries']} (used {info['retries_used']}), "
              f"retry_on_system_failure={sched['retry_on_system_failure']}, "
              f"max_duration={format_duration(sched['max_duration'])}, "
              f"hang_timeout={format_duration(sched['hang_timeout'])}, priority={sched['priority']}")
    table = Table("#", "CLUSTER", "JOB", "NODES", "START", "END", "EXIT", "CAUSE", "OUTCOME", title="resumptions")
    for r in info["resumptions"]:
        outcome = r["outcome"] or r["status"]
        if r.get("detail"):
            outcome += f": {r['detail']}"
        step = (r.get("last_heartbeat") or {}).get("step")
        if step is not None:
            outcome += f" (step {step})"
        table.add_row(str(r["index"]), r["cluster"], str(r["job_id"] or "-"), ",".join(r["nodes"]) or "-",
                      _when(r["start"]), _when(r["end"]), "-" if r["exit_code"] is None else str(r["exit_code"]),
                      r["cause"], outcome)
    out.print(table)
    events = Table("TIME", "EVENT", "MESSAGE", title="events")
    for e in info["events"]:
        events.add_row(_when(e["time"]), e["kind"], e["message"])
    out.print(events)


@app.command("logs")
def logs(name: str, follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines."),
         rank: int = typer.Option(None, "--rank", help="Only this global rank (default: every node)."),
         resumption: int = typer.Option(None, "--resumption", help="This resumption (default: the latest)."),
         ) -> None:
    """Print a run's logs (secret values are replaced by ****)."""
    platform = Platform()
    try:
        _follow(platform, name, rank, resumption, follow)
    except PlatformError as exc:
        fail(exc)


@app.command("stop")
def stop(name: str, wait: bool = typer.Option(False, "--wait", help="Wait until it has stopped.")) -> None:
    """Stop a run gracefully (SIGTERM, stop_grace, SIGKILL)."""
    platform = Platform()
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
        run = Platform().restart_run(name, cluster)
    except PlatformError as exc:
        fail(exc)
    err.print(f"run {run.name}: restart requested ({run.status})")


@app.command("move")
def move(name: str, cluster: str = typer.Option(..., "--cluster", help="Target cluster."),
         follow: bool = typer.Option(False, "--follow", help="Follow the logs until the run ends.")) -> None:
    """Stop a run (it checkpoints on SIGTERM) and resume it on another cluster."""
    platform = Platform()
    try:
        run = platform.move_run(name, cluster)
    except PlatformError as exc:
        fail(exc)
    err.print(f"run {run.name}: moving from {run.cluster} to {cluster}")
    if follow:
        _follow(platform, name)
