"""Cluster backends: one interface (`ClusterBackend`), one class per type."""

from __future__ import annotations

from typing import Any

from tessera.platform.clusters.base import (
    ClusterBackend,
    JobState,
    JobStatus,
    LaunchRequest,
    NodeExit,
    NodeInfo,
)
from tessera.platform.errors import ClusterError

CLUSTER_TYPES = ("local", "slurm", "kubernetes")
LOCAL = "local"   # always exists: this machine


def make_backend(name: str, type_: str, config: dict[str, Any]) -> ClusterBackend:
    if type_ == "local":
        from tessera.platform.clusters.local import LocalBackend
        return LocalBackend(name, config)
    if type_ == "slurm":
        from tessera.platform.clusters.slurm import SlurmBackend
        return SlurmBackend(name, config)
    if type_ == "kubernetes":
        from tessera.platform.clusters.kubernetes import KubernetesBackend
        return KubernetesBackend(name, config)
    raise ClusterError(f"unknown cluster type {type_!r}; use one of {', '.join(CLUSTER_TYPES)}")


__all__ = ["CLUSTER_TYPES", "LOCAL", "ClusterBackend", "JobState", "JobStatus", "LaunchRequest", "NodeExit",
           "NodeInfo", "make_backend"]
