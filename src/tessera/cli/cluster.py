"""`tessera cluster add|list|describe|remove|clear-node`: the places runs go, on the platform `connect()`
picks (a team's server, or this machine), with the same output either way."""

from __future__ import annotations

import json
from typing import Any

import typer

from tessera.cli.console import err, fail
from tessera.cli.describe import describe_cluster
from tessera.cli.output import FORMAT, WIDE, Column, output_format, print_list
from tessera.platform import Platform, PlatformError
from tessera.platform.api.client import RemotePlatform
from tessera.platform.api.connection import connect
from tessera.platform.spec.run_spec import validate_name

# What `cluster list` shows (MCLI's `get clusters` columns); the name first, never cut.
CLUSTER_COLUMNS = (Column("NAME", 0), Column("PROVIDER", 2), Column("GPU TYPES", 4, min_width=9), Column("GPUS", 3),
                   Column("INSTANCE", 5, min_width=8), Column("NODES", 1), Column("ACTIVE RUNS", 2))
NODE_COLUMNS = (Column("NODE", 0), Column("STATE", 1), Column("HEALTHY", 1, styles={"no": "red"}), Column("FAULTS", 2),
                Column("EXCLUDED", 1, styles={"yes": "red"}), Column("REASON", 3, min_width=10))
app = typer.Typer(help="Register clusters (local, slurm, kubernetes) and look at their nodes.", no_args_is_help=True)


def _platform() -> Platform | RemotePlatform:
    try:
        return connect()
    except PlatformError as exc:
        fail(exc)
        raise   # not reached: fail() exits


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
        container: str = typer.Option(None, help="Slurm: how a run's image runs (pyxis | apptainer)."),
        container_runtime: str = typer.Option(None, "--container-runtime",
                                              help="Local: podman | docker | none (default: the one found)."),
        require_image: bool = typer.Option(False, "--require-image",
                                           help="Refuse runs with an image this cluster cannot run in it "
                                                "(default: run on the host with a warning in the logs)."),
        preemptible_qos: str = typer.Option(None, "--preemptible-qos",
                                            help="Slurm: the QOS for runs with scheduling.preemptible."),
        replace: bool = typer.Option(False, "--replace", help="Overwrite a cluster of the same name.")) -> None:
    """Register a cluster."""
    try:   # here, before any server is asked: a bad name is a usage error (exit 2) locally and remotely
        validate_name(name, "cluster name")
    except ValueError as exc:
        fail(exc, code=2)
    try:
        cfg = _platform().add_cluster(name, type_, replace=replace, partition=partition, account=account,
                                       slurm_conf=slurm_conf, master_addr=master_addr, python=python,
                                       namespace=namespace, image=image, kubeconfig=kubeconfig, context=context,
                                       host=host, container=container, container_runtime=container_runtime,
                                       require_image=require_image or None, preemptible_qos=preemptible_qos)
    except PlatformError as exc:
        fail(exc)
    err.print(f"added cluster {name} ({cfg['type']})")


def overview(platform: Platform | RemotePlatform, entry: dict[str, Any]) -> dict[str, Any]:
    """A cluster as MCLI's `get clusters` shows it (provider, GPU types, GPUs, instance, nodes), from its
    settings and what `describe_cluster` reads of its real state now. A cluster that cannot be read has
    no node count rather than failing the whole list."""
    try:
        info = platform.describe_cluster(entry["name"])
    except PlatformError as exc:
        info = {"nodes": f"unavailable: {exc}"}
    nodes = info.get("nodes")
    node_list = nodes if isinstance(nodes, list) else []
    gpu_types = info.get("gpu_types") or sorted({n["gpu_type"] for n in node_list if n.get("gpu_type")})
    gpus = info.get("gpus")
    if gpus is None and any(n.get("gpus") is not None for n in node_list):
        gpus = sum(n.get("gpus") or 0 for n in node_list)
    return {**entry, "provider": entry["type"], "gpu_types": list(gpu_types), "gpus": gpus,
            "instance": info.get("instance"), "nodes": len(node_list) if isinstance(nodes, list) else None,
            "active_runs": len(info.get("active_runs") or [])}


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
          wide: bool = WIDE, fmt: str = FORMAT) -> None:
    """List clusters as MCLI's `get clusters` does ('local', this machine, always exists)."""
    fmt = output_format(fmt, as_json)
    platform = _platform()
    try:
        rows = [overview(platform, c) for c in platform.list_clusters()]
    except PlatformError as exc:
        fail(exc)
    print_list(CLUSTER_COLUMNS, rows, lambda row: (
        row["name"], row["provider"], ", ".join(row["gpu_types"]), row["gpus"], row["instance"],
        "?" if row["nodes"] is None else row["nodes"], row["active_runs"]), fmt, wide)


@app.command("describe")
def describe(name: str, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show a cluster's settings, nodes (health, faults, exclusion) and active runs."""
    try:
        info = _platform().describe_cluster(name)
    except PlatformError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps(info, indent=1))
        return
    typer.echo(describe_cluster(info), nl=False)
    nodes = info.get("nodes")
    if isinstance(nodes, list):
        typer.echo("nodes:")
        print_list(NODE_COLUMNS, nodes, lambda n: (n["name"], n["state"], "yes" if n["healthy"] else "no",
                                                   n["faults"], "yes" if n["excluded"] else "no", n["reason"]),
                   output_format(None))


@app.command("remove")
def remove(name: str) -> None:
    """Forget a cluster (refused while runs are active on it)."""
    try:
        _platform().remove_cluster(name)
    except PlatformError as exc:
        fail(exc)
    err.print(f"removed cluster {name}")


@app.command("clear-node")
def clear_node(name: str, node: str) -> None:
    """Forget a node's recorded faults, so runs may use it again."""
    try:
        cleared = _platform().clear_node(name, node)
    except PlatformError as exc:
        fail(exc)
    if not cleared:
        fail(f"node {node} of {name} has no recorded faults")
    err.print(f"node {node} of {name} cleared")
