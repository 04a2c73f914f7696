"""Parallelism applied to a model, one module per concern (the model only says what its blocks are and,
for tensor parallelism, how its layers split):

    config.py                 the typed `parallelism` section (a Trainer setting, a recipe key)
    plan.py                   that section resolved for a world: mesh, dtypes, what is wrapped (print-config)
    mesh.py                   the named DeviceMesh of a plan
    tensor_parallel.py        DTensor parallel styles from the model's tp_plan()
    activation_checkpoint.py  full, every-n-th block, or selective (op-level) recomputation
    compile.py                torch.compile per block; float8 linear layers (torchao, CUDA)
    fsdp.py                   DDP, FSDP2 full / grad-op / hybrid sharding, optimizers re-pointed
    apply.py                  `parallelize`: the plan applied, in order
    grad_norm.py              the global gradient norm across meshes

    plan = resolve_plan(config, world_size=8, local_world_size=8, device_type="cuda")
    model = parallelize(model, plan, device, optimizers)      # TP -> float8 -> AC -> compile -> FSDP/DDP

The order is torchtitan's: layers are split before anything wraps them, checkpointing and compile work
on the split blocks, and FSDP shards last (over the data-parallel dimensions of the mesh). Importing this
package imports no torch (the config and plan are checked before torch loads); the rest loads on use.
"""

from __future__ import annotations

from tessera.lazy_exports import lazy_exports
from tessera.train.parallel.config import (
    ActivationCheckpointConfig,
    FSDPConfig,
    ParallelismConfig,
    TensorParallelConfig,
    parse_parallelism,
)
from tessera.train.parallel.plan import ParallelismError, ParallelPlan, resolve_plan

__all__ = ["ActivationCheckpointConfig", "FSDPConfig", "ParallelPlan", "ParallelismConfig", "ParallelismError",
           "TensorParallelConfig", "clip_grad_norm_", "fsdp_units", "parallelize", "parse_parallelism",
           "resolve_plan", "total_grad_norm"]

# The torch-side functions, imported on first use.
__getattr__ = lazy_exports(__name__, {"apply": ["parallelize"], "fsdp": ["fsdp_units"],
                                      "grad_norm": ["clip_grad_norm_", "total_grad_norm"]})
