"""The `parallelism` section of a run: how the model is spread over the processes, and the memory and
speed knobs applied with it. Typed, without torch, so a recipe is checked before anything starts.

    parallelism: ddp                       # shorthand: replicate the model, average the gradients
    parallelism: fsdp                      # shorthand: {data_parallel: fsdp} with the defaults below
    parallelism:
      fsdp: {sharding: hybrid, param_dtype: bfloat16, reduce_dtype: float32}   # a section implies fsdp
      tensor_parallel: {degree: 2}
      activation_checkpointing: {mode: every_n, n: 2}
      compile: auto

Settings that depend on the world (a degree that does not divide it, hybrid on one process) are checked
when the plan is resolved for a world size (`plan.resolve_plan`): by `tessera train` before it starts
processes, and by the Trainer at start-up.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DType = Literal["float32", "bfloat16", "float16"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FSDPConfig(Section):
    """FSDP2 (`fully_shard`) settings, used when `data_parallel` is fsdp."""

    sharding: Literal["full_shard", "shard_grad_op", "hybrid"] = Field(
        "full_shard", description="full_shard: weights, grads and optimizer state sharded, weights gathered per "
                                  "block in forward and again in backward; shard_grad_op: weights kept gathered "
                                  "between forward and backward (more memory, less traffic); hybrid (HSDP): "
                                  "shard within a node, replicate across nodes.")
    replicate: int | None = Field(None, ge=1, description="hybrid: replica groups (default: the nodes).")
    shard: int | None = Field(None, ge=1, description="hybrid: processes one replica is sharded over "
                                                      "(default: the processes per node).")
    param_dtype: DType | None = Field(None, description="The dtype blocks compute in (FSDP2 MixedPrecisionPolicy); "
                                                        "null: the parameters' own.")
    reduce_dtype: DType | None = Field(None, description="The dtype gradients are reduced in; null: param_dtype.")
    cpu_offload: bool = Field(False, description="Keep sharded parameters, gradients and optimizer state in "
                                                 "host memory (CPUOffloadPolicy); the optimizer steps on the CPU.")


class TensorParallelConfig(Section):
    """Tensor parallelism over a mesh dimension of `degree` processes (DTensor parallel styles)."""

    degree: int = Field(1, ge=1, description="Processes one model's layers are split over; 1: off. Must divide "
                                             "the world; the data-parallel degree is world / degree.")
    sequence_parallel: bool = Field(True, description="Also split the norms and the residual stream along the "
                                                      "sequence (models whose plan has sequence-parallel parts).")


class ActivationCheckpointConfig(Section):
    """What the backward recomputes instead of keeping: trades compute for activation memory."""

    mode: Literal["none", "full", "every_n", "selective"] = Field(
        "none", description="full: every block keeps only its input and reruns its forward in backward; every_n: "
                            "every n-th block does; selective: op-level (torchtitan's): every block keeps the outputs "
                            "of attention and of every other matmul, and recomputes the cheap rest.")
    n: int = Field(2, ge=1, description="every_n: checkpoint blocks 0, n, 2n, ...")

    def __bool__(self) -> bool:
        """True when anything is recomputed (`if parallelism.activation_checkpointing:`)."""
        return self.mode != "none"


def _ac_shorthand(value: Any) -> Any:
    if value is None or value is False:
        return {"mode": "none"}
    if value is True:
        return {"mode": "full"}
    return {"mode": value} if isinstance(value, str) else value


class ParallelismConfig(Section):
    """How the model is spread over the processes, and the memory and speed knobs (module docstring)."""

    data_parallel: Literal["ddp", "fsdp", "none"] = Field(
        "ddp", description="ddp: a whole model per process; fsdp: sharded (see fsdp); none: no wrapping. Setting "
                           "the fsdp section implies fsdp.")
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig)  # type: ignore[arg-type]
    tensor_parallel: TensorParallelConfig = Field(default_factory=TensorParallelConfig)  # type: ignore[arg-type]
    activation_checkpointing: ActivationCheckpointConfig = Field(
        default_factory=ActivationCheckpointConfig)  # type: ignore[arg-type]
    compile: Literal["auto", True, False] = Field(
        "auto", description="torch.compile each block; auto: on CUDA, off on the CPU.")
    float8: bool = Field(False, description="float8 matmuls in the blocks' linear layers through torchao "
                                            "(CUDA GPUs with float8 support only).")

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, value: Any) -> Any:
        """`ddp`, `fsdp`, `none` or null name the data-parallel mode alone; an fsdp section implies fsdp."""
        if isinstance(value, str) and value not in ("ddp", "fsdp", "none"):
            raise ValueError(f"unknown parallelism {value!r}; use 'ddp', 'fsdp', None or a parallelism section")
        if value is None or isinstance(value, str):
            return {"data_parallel": value or "none"}
        if isinstance(value, dict):
            value = dict(value)
            if "fsdp" in value and "data_parallel" not in value:
                value["data_parallel"] = "fsdp"
            if "activation_checkpointing" in value:
                value["activation_checkpointing"] = _ac_shorthand(value["activation_checkpointing"])
        return value

    @model_validator(mode="after")
    def _fsdp_needs_fsdp(self) -> ParallelismConfig:
        if self.data_parallel != "fsdp" and self.fsdp != FSDPConfig():
            raise ValueError(f"fsdp settings are given but data_parallel is {self.data_parallel}: set "
                             "parallelism.data_parallel=fsdp (or remove the fsdp section)")
        return self

    @property
    def sharding(self) -> str:
        """One word for the data-parallel layout: none, ddp, full_shard, shard_grad_op or hybrid."""
        return self.fsdp.sharding if self.data_parallel == "fsdp" else self.data_parallel

    @property
    def tp_degree(self) -> int:
        return self.tensor_parallel.degree


def parse_parallelism(value: Any) -> ParallelismConfig:
    """A ParallelismConfig from its shorthand (`ddp`, `fsdp`, None), a mapping, or itself."""
    return value if isinstance(value, ParallelismConfig) else ParallelismConfig.model_validate(value)
