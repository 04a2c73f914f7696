"""`tessera cluster add|list|describe|remove`: the places runs go."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from tessera.cli.console import err, fail, out
from tessera.platform import Platform, PlatformError

app = typer.Typer(help="Register clusters (local, slurm, kubernetes) and look at their nodes.", no_args_is_help=True)


@app.command("add")
def add(name: str = typer.Argument(..., help="Cluster name (used as compute.cluster in run specs)."),
        type_: str = typer.Option(..., "--type", help="local | slurm | kubernetes (experimental)."),
        partition: str = typer.Option(None, help="Slurm partition."),
        account: str = typer.Option(None, help="Slurm account."),
        slurm_conf: str = typer.Option(None, "--slurm-conf", help="slurm.conf for every Slurm command (SLURM_CONF)."),
        master_addr: str = typer.Option(None, "--master-addr",
                                        help="MASTER_ADDR for multi-node runs (default: first node's NodeAddr)."),
        python: str = typer.Option(None, help="Python on the nodes that runs Tessera's launcher (default: this one)."),
        namespace: str = typer.Option(None, help="Kubernetes namespace."),
        image: str = typer.Option(None, help="Kubernetes: default container image."),
        kubeconfig: str = typer.Option(None, help="Kubernetes: kubeconfig file (default: ~/.kube/config)."),
        context: str = typer.Option(None, help="Kubernetes: kubeconfig context."),
        host: str = typer.Option(None, help="Kubernetes: API server URL (instead of a kubeconfig)."),
        replace: bool = typer.Option(False, "--replace", help="Overwrite a cluster of the same name.")) -> None:
    """Register a cluster."""
    try:
        cfg = Platform().add_cluster(name, type_, replace=replace, partition=partition, account=account,
                                     slurm_conf=slurm_conf, master_addr=master_addr, python=python,
                                     namespace=namespace, image=image, kubeconfig=kubeconfig, context=context,
                                     host=host)
    except PlatformError as exc:
        fail(exc)
    err.print(f"added cluster {name} ({cfg['type']})")


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="One JSON object per line.")) -> None:
    """List clusters ('local', this machine, always exists)."""
    clusters = Platform().list_clusters()
    if as_json:
        for c in clusters:
            typer.echo(json.dumps(c))
        return
    table = Table("NAME", "TYPE", "SETTINGS")
    for c in clusters:
        settings = ", ".join(f"{k}={v}" for k, v in c.items() if k not in ("name", "type"))
        table.add_row(c["name"], c["type"], settings)
    out.print(table)


@app.command("describe")
def describe(name: str, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show a cluster's settings, nodes (health, faults, exclusion) and active runs."""
    try:
        info = Platform().describe_cluster(name)
    except PlatformError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(info, indent=1))
        return
    for key, value in info.items():
        if key != "nodes":
            out.print(f"[bold]{key}[/bold]: {value}")
    nodes = info.get("nodes")
    if isinstance(nodes, list):
        table = Table("NODE", "STATE", "HEALTHY", "FAULTS", "EXCLUDED", "REASON")
        for n in nodes:
            table.add_row(n["name"], n["state"], "yes" if n["healthy"] else "[red]no[/red]", str(n["faults"]),
                          "[red]yes[/red]" if n["excluded"] else "no", n["reason"])
        out.print(table)
    else:
        out.print(f"[bold]nodes[/bold]: {nodes}")


@app.command("remove")
def remove(name: str) -> None:
    """Forget a cluster (refused while runs are active on it)."""
    try:
        Platform().remove_cluster(name)
    except PlatformError as exc:
        fail(exc)
    err.print(f"removed cluster {name}")


@app.command("clear-node")
def clear_node(name: str, node: str) -> None:
    """Forget a node's recorded faults, so runs may use it again."""
    if not Platform().clear_node(name, node):
        fail(ValueError(f"node {node} of {name} has no recorded faults"))
    err.print(f"node {node} of {name} cleared")
