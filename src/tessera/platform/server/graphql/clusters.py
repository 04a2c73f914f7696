"""`getClusters`: the team's clusters (Platform.list_clusters / describe_cluster) as MCLI's clusters.

MCLI shows a cluster as its instances (nodes of one shape: GPU type, GPUs, CPUs); Tessera's clusters
report their nodes, so nodes of the same shape make one instance. A cluster whose scheduler cannot be
asked (no `sinfo` here, say) shows one instance with no nodes. Utilization (`mcli describe cluster`)
lists the cluster's active runs, queued (PENDING, QUEUED) or running; inference deployments are empty.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from strawberry.types import Info

from tessera.platform.api.sdk import Platform
from tessera.platform.server.accounts import Principal
from tessera.platform.server.graphql import types
from tessera.platform.server.graphql.context import Context, with_platform
from tessera.platform.server.graphql.inputs import GetClustersInput
from tessera.platform.server.graphql.run_input import mcli_priority
from tessera.platform.server.graphql.views import iso
from tessera.platform.spec.run_spec import RunSpec

QUEUED = ("PENDING", "QUEUED")


def _instances(nodes: list[dict[str, Any]] | str) -> list[types.Instance]:
    if isinstance(nodes, str):
        return [types.Instance(name="unavailable", gpu_type="None", gpus_per_node=0, cpus=None, memory="", storage="",
                               gpu_nums=[], num_nodes=0, nodes=[])]
    shapes: dict[tuple[str, int, int | None], list[dict[str, Any]]] = defaultdict(list)
    for node in nodes:
        shapes[(node["gpu_type"] or "None", node["gpus"] or 0, node["cpus"])].append(node)
    return [types.Instance(
        name=f"{gpu_type.lower()}x{gpus}" if gpus else "cpu", gpu_type=gpu_type, gpus_per_node=gpus, cpus=cpus,
        memory="", storage="", gpu_nums=[gpus] if gpus else [0], num_nodes=len(group),
        nodes=[types.ClusterNode(name=n["name"], is_alive=n["healthy"],
                                 is_schedulable=n["healthy"] and not n["excluded"], up_time=None) for n in group])
        for (gpu_type, gpus, cpus), group in sorted(shapes.items(), key=lambda kv: kv[0][:2])]


def _run_use(run: dict[str, Any], instance: str) -> types.RunUtilization:
    spec = RunSpec.model_validate(run["spec"])
    started = [r["start"] for r in run["resumptions"] if r["start"] is not None]
    return types.RunUtilization(
        id=run["id"], created_at=iso(run["created"]) or "", user_name=run["user"] or "", run_name=run["name"],
        instance=instance, gpu_num=spec.compute.gpus_per_node * spec.compute.nodes,
        gpu_type=spec.compute.gpu_type or "None", estimated_end_time=None,
        max_duration_seconds=None if spec.scheduling.max_duration is None else int(spec.scheduling.max_duration),
        start_time=iso(started[0]) if started else None, reason=run["first_error"],
        scheduling=types.RunScheduling(priority=mcli_priority(spec.scheduling.priority),
                                       retry_on_system_failure=spec.scheduling.retry_on_system_failure,
                                       preemptible=spec.scheduling.preemptible))


def _utilization(platform: Platform, described: dict[str, Any], instances: list[types.Instance]
                 ) -> types.ClusterUtilization:
    runs = [platform.describe_run(name) for name in described["active_runs"]]
    first = instances[0].name
    active = [_run_use(r, first) for r in runs if r["status"] not in QUEUED]
    used = sum(r.gpu_num for r in active)
    utils = []
    for instance in instances:
        total = instance.gpus_per_node * instance.num_nodes
        taken = min(total, used)
        used -= taken
        utils.append(types.InstanceUtilization(instance=instance, cluster_id=described["name"], gpus_used=taken,
                                               gpus_available=total - taken, gpus_total=total))
    return types.ClusterUtilization(instance_utils=utils, active_runs_by_user=active,
                                    queued_runs_by_user=[_run_use(r, first) for r in runs if r["status"] in QUEUED],
                                    active_deployments_by_user=[], queued_deployments_by_user=[])


def cluster_view(platform: Platform, name: str) -> types.Cluster:
    described = platform.describe_cluster(name)
    instances = _instances(described["nodes"])
    multinode = described.get("type") != "local"
    return types.Cluster(
        id=name, name=name, provider=str(described.get("type", "")).upper(), allow_fractional=True,
        allow_multinode=multinode, allowed_submission_types=["TRAINING"], is_multi_tenant=False,
        reservation_type=None, scheduler_enabled=multinode, allowed_instances=instances,
        utilization=_utilization(platform, described, instances))


async def get_clusters(info: Info[Context, Any], get_clusters_data: GetClustersInput) -> list[types.Cluster]:
    f = get_clusters_data.filters
    names = f.name.in_ if f is not None and f.name is not None else None
    wanted = f.allowed_submission_types.has if f is not None and f.allowed_submission_types is not None else None

    def work(platform: Platform, _who: Principal) -> list[types.Cluster]:
        if wanted is not None and wanted.upper() != "TRAINING":
            return []
        listed = [c["name"] for c in platform.list_clusters()]
        return [cluster_view(platform, name) for name in listed if names is None or name in names]

    return await with_platform(info, work)
