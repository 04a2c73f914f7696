"""The cluster half of `Platform` (api/sdk.py): register, list, describe and remove a team's clusters, and
clear a node's faults. Kept apart from the runs' verbs, which are most of the platform; `Platform`
inherits these, so the interface (api/interface.py) still has one in-process implementation."""

from __future__ import annotations

from typing import Any

from tessera.platform.clusters import CLUSTER_TYPES, LOCAL, ClusterBackend, NodeInfo, make_backend
from tessera.platform.errors import ClusterError
from tessera.platform.spec.run_spec import validate_name
from tessera.platform.store.state import ACTIVE, StateDB
from tessera.platform.supervision.context import cluster_backend


class ClusterVerbs:
    """The cluster verbs over the team's store `db` (set by `Platform.__init__`)."""

    db: StateDB

    def add_cluster(self, name: str, type_: str, *, replace: bool = False, **config: Any) -> dict[str, Any]:
        validate_name(name, "cluster name")
        if type_ not in CLUSTER_TYPES:
            raise ClusterError(f"unknown cluster type {type_!r}; use one of {', '.join(CLUSTER_TYPES)}")
        if not replace and self.db.get_cluster(name):
            raise ClusterError(f"cluster {name!r} exists; remove it first (tessera cluster remove {name})")
        config = {k: v for k, v in config.items() if v not in (None, "", [], {})}
        make_backend(name, type_, config)   # fails early on a bad config or a missing client library
        self.db.add_cluster(name, type_, config, replace=replace)
        return {"name": name, "type": type_, **config}

    def list_clusters(self) -> list[dict[str, Any]]:
        records = {c.name: {"name": c.name, "type": c.type, **c.config} for c in self.db.list_clusters()}
        records.setdefault(LOCAL, {"name": LOCAL, "type": "local", "builtin": True})
        return [records[name] for name in sorted(records)]

    def backend(self, name: str) -> ClusterBackend:
        return cluster_backend(self.db, name)

    def describe_cluster(self, name: str) -> dict[str, Any]:
        backend = self.backend(name)
        out: dict[str, Any] = backend.describe()
        try:
            nodes: list[NodeInfo] | str = backend.nodes()
        except ClusterError as exc:
            nodes = f"unavailable: {exc}"
        excluded = set(self.db.excluded_nodes(name))
        faults = {f["node"]: f for f in self.db.node_faults(name)}
        if isinstance(nodes, list):
            out["nodes"] = [{"name": n.name, "state": n.state, "healthy": n.healthy, "reason": n.reason,
                             "excluded": n.name in excluded, "faults": faults.get(n.name, {}).get("faults", 0),
                             "cpus": n.cpus, "gpus": n.gpus, "gpu_type": n.gpu_type}
                            for n in nodes]
        else:
            out["nodes"] = nodes
        out["excluded_nodes"] = sorted(excluded)
        out["active_runs"] = [r.name for r in self.db.list_runs(ACTIVE, cluster=name)]
        return out

    def remove_cluster(self, name: str) -> None:
        active = self.db.list_runs(ACTIVE, cluster=name)
        if active:
            raise ClusterError(f"cluster {name!r} has active runs ({', '.join(r.name for r in active)}); "
                               "stop or move them first")
        if not self.db.remove_cluster(name):
            raise ClusterError(f"cluster {name!r} is not known")

    def clear_node(self, cluster: str, node: str) -> bool:
        """Forget a node's faults, so it is used again."""
        return self.db.clear_node(cluster, node)
