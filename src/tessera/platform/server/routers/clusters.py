"""The team's clusters: list (what MCLI's `get clusters` shows), add, describe (nodes, faults, what runs
where), remove, and clearing a node's faults."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from tessera.platform.api.models import ClusterDetail, ClusterInfo, ClusterList, NewCluster, NodeCleared
from tessera.platform.api.sdk import Platform
from tessera.platform.errors import ClusterNotFound
from tessera.platform.server.auth import CurrentUser, State, TeamPlatform
from tessera.platform.server.params import ClusterName

router = APIRouter(prefix="/clusters", tags=["clusters"])
NodeName = Annotated[str, Path(max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


@router.get("")
def list_clusters(platform: TeamPlatform) -> ClusterList:
    return ClusterList.model_validate({"clusters": platform.list_clusters()})


@router.post("", status_code=201)
def add_cluster(body: NewCluster, who: CurrentUser, state: State, platform: TeamPlatform) -> ClusterInfo:
    with state.audit.change(who, "cluster add", body.name, f"type {body.type}" + (" (replaced)" if body.replace else "")):
        cluster = platform.add_cluster(body.name, body.type, replace=body.replace, **body.settings())
    return ClusterInfo.model_validate(cluster)


@router.get("/{name}")
def describe_cluster(name: ClusterName, platform: TeamPlatform) -> ClusterDetail:
    _known(platform, name)
    return ClusterDetail.model_validate(platform.describe_cluster(name))


@router.delete("/{name}", status_code=204, response_class=Response)
def remove_cluster(name: ClusterName, who: CurrentUser, state: State, platform: TeamPlatform) -> Response:
    _known(platform, name)
    with state.audit.change(who, "cluster remove", name):
        platform.remove_cluster(name)
    return Response(status_code=204)


@router.post("/{name}/nodes/{node}/clear")
def clear_node(name: ClusterName, node: NodeName, who: CurrentUser, state: State, platform: TeamPlatform
               ) -> NodeCleared:
    _known(platform, name)
    with state.audit.change(who, "node clear", f"{name}/{node}") as entry:
        cleared = platform.clear_node(name, node)
        entry.detail = "cleared" if cleared else "had no faults"
    return NodeCleared(cluster=name, node=node, cleared=cleared)


def _known(platform: Platform, name: str) -> None:
    if name not in {c["name"] for c in platform.list_clusters()}:
        raise ClusterNotFound(f"no cluster named {name!r} (see GET /api/v1/clusters)")
