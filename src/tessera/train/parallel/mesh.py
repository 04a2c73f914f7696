"""The device mesh of a plan: one named dimension per kind of parallelism (plan.py lists them)."""

from __future__ import annotations

from typing import Any

from tessera.train.parallel.plan import ParallelPlan


def build_mesh(plan: ParallelPlan, device_type: str) -> Any:
    """The plan's DeviceMesh over every process (None for one process). Dimensions of size 1 are kept
    where the plan names them (a 2x1 hybrid mesh is still a 2-D mesh)."""
    if not plan.mesh_dims:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, plan.mesh_shape, mesh_dim_names=plan.mesh_dims)


def submesh(mesh: Any, dims: tuple[str, ...]) -> Any:
    """The sub-mesh over `dims` (the mesh itself when it has exactly those)."""
    if tuple(mesh.mesh_dim_names) == dims:
        return mesh
    return mesh[dims if len(dims) > 1 else dims[0]]
