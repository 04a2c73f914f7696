"""Can a cluster still hold a run once its bad nodes are excluded?

Excluding every node that failed keeps a run off broken hardware, but on a small cluster it can leave
fewer usable nodes than the run's gang needs. Slurm would then keep the job pending forever (or reject
it); the supervisor checks first and fails the run with a cause that names the excluded nodes and the
count it needs. The policy is deliberately not to take nodes back by itself: a node excluded after
faults is suspect until someone looks (`tessera cluster clear-node CLUSTER NODE`).
"""

from __future__ import annotations

from typing import Any

from tessera.platform.clusters import ClusterBackend
from tessera.platform.errors import PlatformError


def too_few_nodes(backend: ClusterBackend, needed: int, faults: list[dict[str, Any]]) -> str | None:
    """Why `backend` cannot give `needed` nodes outside its excluded ones, or None when it can (or when
    it cannot tell: then the scheduler decides). `faults` are the cluster's node_faults rows."""
    if backend.type == "local":
        return None   # one node, never excluded
    try:
        nodes = [n.name for n in backend.nodes()]
    except PlatformError:
        return None
    if not nodes:
        return None
    excluded = {f["node"]: f for f in faults if f["excluded"] and f["node"] in nodes}
    usable = [n for n in nodes if n not in excluded]
    if len(usable) >= needed:
        return None
    why = "; ".join(f"{n} after {f['faults']} fault(s), last: {f['reason']}" for n, f in sorted(excluded.items()))
    text = (f"the run needs {needed} node(s) but cluster {backend.name!r} has {len(nodes)} "
            f"({', '.join(nodes)})")
    if excluded:
        text += (f", {len(excluded)} of them excluded ({why}), leaving {len(usable)}"
                 f"{': ' + ', '.join(usable) if usable else ''}. Take a node back with `tessera cluster "
                 f"clear-node {backend.name} NODE` once it is repaired, then `tessera run restart`")
    return text
