"""The parallel plan: a `ParallelismConfig` resolved for one world (processes, nodes, device), before any
process group exists. `tessera train --print-config` shows it, `tessera train` checks it before starting
processes, and `parallelize` applies it. No torch here: a bad setting fails in one line naming its key.

The device mesh has one dimension per kind of parallelism, outermost first, as torchtitan lays it out:

    dp_replicate  hybrid FSDP (HSDP): replicas, gradients all-reduced between them (usually across nodes)
    dp_shard      FSDP: parameters, gradients and optimizer state sharded (within a node for hybrid)
    dp            DDP: whole replicas
    tp            tensor parallelism: each layer split over these processes (innermost: the fastest links)

Data-parallel degree = world / tensor-parallel degree: processes of one tp group see the same batch.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from typing import Any

from tessera.train.parallel.config import ParallelismConfig, parse_parallelism


class ParallelismError(ValueError):
    """The parallelism settings cannot run on this world; the message names the key to change."""


@dataclass(frozen=True)
class ParallelPlan:
    """What `parallelize` does to the model, for one world."""

    world_size: int
    nodes: int
    data_parallel: str                 # "none", "ddp" or "fsdp"
    sharding: str                      # "none", "ddp", "full_shard", "shard_grad_op" or "hybrid"
    mesh_dims: tuple[str, ...]         # () for one process
    mesh_shape: tuple[int, ...]
    tp_degree: int = 1
    sequence_parallel: bool = True
    reshard_after_forward: bool = True
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    cpu_offload: bool = False
    activation_checkpointing: str = "none"
    checkpoint_every: int = 1
    compile: bool = False
    float8: bool = False
    model_dtype: str | None = None     # pure_bf16: the whole model is cast to bfloat16

    @property
    def dp_degree(self) -> int:
        return self.world_size // self.tp_degree

    @property
    def dp_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.mesh_dims if d != "tp")

    def describe(self, blocks: str | None = None) -> dict[str, Any]:
        """The plan as plain values (print-config): mesh, dtypes, what is wrapped, checkpointed and compiled.
        `blocks` names the model's blocks when the caller knows them (e.g. "transformer.blocks.0..3")."""
        units = blocks or "the model's blocks (its blocks() or fsdp_units(), else its ModuleList items)"
        n = self.checkpoint_every
        ac = {"none": "nothing", "full": f"every block: {units}", "selective": f"op-level in every block: {units}",
              "every_n": f"blocks 0, {n}, {2 * n}, ... of {units}"}[self.activation_checkpointing]
        out: dict[str, Any] = {
            "world_size": self.world_size, "nodes": self.nodes,
            "mesh": {"dims": list(self.mesh_dims), "shape": list(self.mesh_shape)} if self.mesh_dims else None,
            "data_parallel": self.sharding if self.world_size > 1 else "none (one process: nothing to wrap)",
            "tensor_parallel": ({"degree": self.tp_degree, "sequence_parallel": self.sequence_parallel,
                                 "split": "attention and MLP of every block (the model's tp_plan())"}
                                if self.tp_degree > 1 else None),
            "activation_checkpointing": {"mode": self.activation_checkpointing, "recomputes": ac},
            "compile": f"each block ({units})" if self.compile else False,
            "float8": self.float8, "model_dtype": self.model_dtype or "the model's own (float32 unless it says)",
        }
        if self.data_parallel == "fsdp" and self.dp_degree > 1:
            out["fsdp"] = {"wrapped": f"each of {units}, then the root", "over": list(self.dp_dims),
                           "reshard_after_forward": self.reshard_after_forward,
                           "param_dtype": self.param_dtype or "the parameters' own",
                           "reduce_dtype": self.reduce_dtype or self.param_dtype or "the parameters' own",
                           "cpu_offload": self.cpu_offload}
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fail(key: str, message: str) -> ParallelismError:
    return ParallelismError(f"parallelism.{key}: {message}")


def resolve_plan(parallelism: ParallelismConfig | str | dict[str, Any] | None, world_size: int = 1,
                 local_world_size: int | None = None, device_type: str = "cpu",
                 precision: str = "fp32") -> ParallelPlan:
    """The plan of `parallelism` on `world_size` processes (`local_world_size` per node, default all on
    one node) on `device_type`; ParallelismError naming the key when it cannot run there."""
    cfg = parse_parallelism(parallelism)
    local = local_world_size or world_size
    nodes = max(1, world_size // local)
    tp = cfg.tensor_parallel.degree
    if tp > world_size or world_size % tp:
        raise _fail("tensor_parallel.degree", f"{tp} does not divide the world of {world_size} process(es); use a "
                                              f"divisor of {world_size}, or start more processes (-n)")
    dp = world_size // tp
    mode = cfg.data_parallel if dp > 1 else "none"
    sharding = cfg.sharding if dp > 1 else "none"
    fsdp = cfg.fsdp
    if cfg.data_parallel == "fsdp" and fsdp.sharding == "hybrid":
        if world_size < 2:
            raise _fail("fsdp.sharding", "hybrid shards within a node and replicates across nodes, so it needs at "
                                         "least 2 processes; use full_shard on one, or start more (-n)")
        shard = fsdp.shard or (fsdp.replicate and dp // fsdp.replicate) or max(1, min(local // tp, dp))
        replicate = fsdp.replicate or dp // shard
        if replicate * shard != dp:
            key = "fsdp.shard" if fsdp.shard else "fsdp.replicate"
            raise _fail(key, f"replicate x shard must equal the data-parallel degree {dp} (world {world_size} / "
                             f"tensor_parallel.degree {tp}), got replicate={replicate} x shard={shard}")
        dims, shape = ("dp_replicate", "dp_shard"), (replicate, shard)
    elif fsdp.replicate or fsdp.shard:
        raise _fail("fsdp.replicate", "replicate and shard are the degrees of hybrid sharding only; set "
                                      "parallelism.fsdp.sharding=hybrid or remove them")
    elif dp > 1:
        dims, shape = ("dp_shard" if mode == "fsdp" else "dp",), (dp,)
    else:
        dims, shape = (), ()
    if tp > 1:
        dims, shape = (*dims, "tp"), (*shape, tp)
        if cfg.data_parallel == "ddp" and dp > 1:
            raise _fail("data_parallel", "ddp does not combine with tensor_parallel (DDP needs whole parameters); "
                                         "use parallelism.data_parallel=fsdp for the data-parallel dimension")
    if fsdp.cpu_offload and cfg.data_parallel != "fsdp":
        raise _fail("fsdp.cpu_offload", "offloading works on FSDP's shards: set parallelism.data_parallel=fsdp")
    if cfg.float8:
        float8_available(device_type)
    ac = cfg.activation_checkpointing
    return ParallelPlan(
        world_size=world_size, nodes=nodes, data_parallel=mode, sharding=sharding, mesh_dims=dims, mesh_shape=shape,
        tp_degree=tp, sequence_parallel=cfg.tensor_parallel.sequence_parallel,
        reshard_after_forward=fsdp.sharding != "shard_grad_op", param_dtype=fsdp.param_dtype,
        reduce_dtype=fsdp.reduce_dtype, cpu_offload=fsdp.cpu_offload, activation_checkpointing=ac.mode,
        checkpoint_every=ac.n if ac.mode == "every_n" else 1,
        compile=device_type == "cuda" if cfg.compile == "auto" else bool(cfg.compile), float8=cfg.float8,
        model_dtype="bfloat16" if precision == "pure_bf16" else None)


def float8_available(device_type: str) -> None:
    """float8 training runs on CUDA GPUs with float8 matmuls (H100-class) through torchao; elsewhere a
    one-line error, before any process starts."""
    if device_type != "cuda":
        raise _fail("float8", f"float8 training needs a CUDA GPU with float8 support (H100 or newer) and torchao; "
                              f"this run is on {device_type}: remove parallelism.float8")
    if importlib.util.find_spec("torchao") is None:
        raise _fail("float8", "float8 training needs torchao: pip install torchao (or remove parallelism.float8)")
