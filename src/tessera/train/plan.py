"""A training plan before any GPU is rented: memory per device, FLOPs and the throughput to expect.

    counts = ModelCounts(params=6.7e9, trainable=6.7e9, n_layers=32, d_model=4096, vocab_size=50368,
                         seq_len=2048, flops_per_token=4.1e10)
    layout = Layout(world_size=64, sharding="full_shard", shard_degree=64, precision="amp_bf16")
    plan = make_plan(counts, layout, accelerator("H100"), per_device_batch=16, microbatch=2)
    plan.memory.total_gb, plan.fits, plan.tokens_per_sec_per_device

Everything here is arithmetic on plain numbers: the model-specific counts (`params`, `flops_per_token`)
come from the model itself (built on the meta device by the caller: `tessera train RECIPE --plan`), the
layout from the recipe's parallelism, the device from `hardware.py`.

Memory per device, in bytes (N = parameters, T = trainable parameters, s = shard degree of the states,
t = tensor-parallel degree, m = microbatch, L = sequence length):

- weights: N x 4 / (s x t). The weights stay fp32 under autocast (bf16/fp16 run as casts inside ops);
  DDP and FSDP's `shard_grad_op` keep them whole (s = 1 for weights), `full_shard` and `hybrid` shard
  them over the shard group.
- working copies: the low-precision weights the step computes with. DDP under autocast keeps a cast of
  every weight for the forward (autocast's cache, N x 2 / t); FSDP gathers the weights of one block at a
  time and prefetches the next, two blocks' worth in the compute dtype.
- gradients: T x 4 / (s x t), sharded by every FSDP strategy, whole under DDP.
- optimizer state: AdamW's two moments, T x 8 / (s x t).
- activations, kept for the backward, per layer and token: 34 x d_model bytes at 16-bit (Korthikanti et
  al. 2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 2, with a fused attention
  kernel so the 5 x heads x L / d_model term of the scores is gone), doubled at fp32, divided by t
  (tensor parallelism with sequence parallelism). With activation checkpointing a layer keeps only its
  input (2 x d_model bytes at 16-bit) and one layer is recomputed at a time (its full 34 x d_model).
  Plus the output layer: logits in the compute dtype and an fp32 copy for the cross-entropy,
  vocab x (bytes + 4) per token. All of it x m x L tokens.

A device fits the plan when the total is at most `USABLE_FRACTION` of its memory: the rest goes to the
CUDA context, NCCL buffers and the allocator's fragmentation. These are estimates (within ~10-20% of
`torch.cuda.max_memory_allocated` for GPT-style models); the run's own figure is logged as
`memory/allocated_peak_gb`.

Throughput: tokens/s per device = efficiency x peak FLOP/s / FLOPs per token, where efficiency is the
assumed hardware FLOPs utilisation (`DEFAULT_EFFICIENCY`, stated in every plan). MFU counts only the
model's FLOPs: activation checkpointing reruns the forward (2N of the 6N per token), so the same hardware
utilisation gives MFU x 6/8 with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tessera.train.hardware import DTYPE_OF_PRECISION, Accelerator

GB = 1e9
USABLE_FRACTION = 0.9
DEFAULT_EFFICIENCY = 0.45  # assumed hardware FLOPs utilisation of a well-tuned dense transformer step
ACT_BYTES_PER_TOKEN_LAYER_16BIT = 34  # x d_model; Korthikanti et al. 2022 without the attention-score term
CHECKPOINTED_BYTES_16BIT = 2  # x d_model: a checkpointed layer keeps its input only
Sharding = Literal["none", "ddp", "full_shard", "shard_grad_op", "hybrid"]


@dataclass(frozen=True)
class ModelCounts:
    """What a plan needs to know of a model; `params` and `flops_per_token` come from the model itself."""

    params: int
    trainable: int
    n_layers: int
    d_model: int
    vocab_size: int
    seq_len: int
    flops_per_token: float  # training FLOPs (forward + backward) per token at seq_len
    block_params: int = 0  # parameters of one block (what FSDP gathers at a time); 0: params / n_layers


@dataclass(frozen=True)
class Layout:
    """How the run spreads over devices: the plain numbers the memory maths needs."""

    world_size: int = 1
    sharding: Sharding = "ddp"
    shard_degree: int = 1  # devices one FSDP shard group spans (hybrid: within a node; full_shard: all)
    tp_degree: int = 1
    precision: str = "amp_bf16"  # a Trainer precision: fp32, amp_bf16, amp_fp16
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.tp_degree < 1 or self.shard_degree < 1 or self.world_size < 1:
            raise ValueError("world_size, shard_degree and tp_degree must be >= 1")
        if self.world_size % self.tp_degree:
            raise ValueError(f"tensor-parallel degree {self.tp_degree} does not divide {self.world_size} devices")

    @property
    def states_shard(self) -> int:
        """Over how many devices gradients and optimizer states are split (besides tensor parallelism)."""
        return self.shard_degree if self.sharding in ("full_shard", "shard_grad_op", "hybrid") else 1

    @property
    def weights_shard(self) -> int:
        return self.shard_degree if self.sharding in ("full_shard", "hybrid") else 1


@dataclass(frozen=True)
class Memory:
    """Bytes per device by component; `total` is their sum."""

    weights: float
    working_copies: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.working_copies + self.gradients + self.optimizer + self.activations

    def gb(self) -> dict[str, float]:
        return {"weights": self.weights / GB, "working_copies": self.working_copies / GB,
                "gradients": self.gradients / GB, "optimizer": self.optimizer / GB,
                "activations": self.activations / GB, "total": self.total / GB}


@dataclass(frozen=True)
class Plan:
    counts: ModelCounts
    layout: Layout
    device: Accelerator
    microbatch: int
    memory: Memory
    memory_other_ac: Memory  # the same plan with activation checkpointing the other way round
    efficiency: float
    peak_flops: float | None
    fits: bool
    largest_microbatch: int  # the largest power-of-two microbatch (<= the per-device batch) that fits; 0: none
    warnings: list[str] = field(default_factory=list)

    @property
    def tokens_per_sec_per_device(self) -> float | None:
        """Expected model tokens/s per device at the assumed efficiency (hardware FLOPs incl. recompute)."""
        if not self.peak_flops:
            return None
        return self.efficiency * self.peak_flops / (self.counts.flops_per_token * self._recompute_factor)

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation those tokens/s mean (recomputation is not model FLOPs)."""
        return None if not self.peak_flops else self.efficiency / self._recompute_factor

    @property
    def tokens_per_sec(self) -> float | None:
        per = self.tokens_per_sec_per_device
        return None if per is None else per * self.layout.world_size

    @property
    def _recompute_factor(self) -> float:
        return 8 / 6 if self.layout.activation_checkpointing else 1.0


def _bytes_of(precision: str) -> int:
    return 4 if DTYPE_OF_PRECISION.get(precision, precision) == "fp32" else 2


def memory(counts: ModelCounts, layout: Layout, microbatch: int) -> Memory:
    """Bytes per device for one microbatch of `microbatch` sequences (see the module docstring)."""
    t, act_bytes = layout.tp_degree, _bytes_of(layout.precision)
    low_precision = act_bytes == 2
    weights = counts.params * 4 / (layout.weights_shard * t)
    if layout.sharding in ("full_shard", "hybrid") and layout.shard_degree > 1:
        block = counts.block_params or counts.params / max(1, counts.n_layers)
        working = 2 * block * act_bytes / t  # the gathered block and the prefetched next one
    else:
        working = counts.params * 2 / t if low_precision else 0.0  # autocast's cast of every weight
    gradients = counts.trainable * 4 / (layout.states_shard * t)
    optimizer = counts.trainable * 8 / (layout.states_shard * t)
    tokens = microbatch * counts.seq_len
    scale = act_bytes / 2
    full_layer = ACT_BYTES_PER_TOKEN_LAYER_16BIT * counts.d_model * scale / t
    if layout.activation_checkpointing:
        per_token = counts.n_layers * CHECKPOINTED_BYTES_16BIT * counts.d_model * scale / t + full_layer
    else:
        per_token = counts.n_layers * full_layer
    per_token += counts.vocab_size * (act_bytes + 4) / t  # logits and the fp32 copy the loss reads
    return Memory(weights, working, gradients, optimizer, per_token * tokens)


def make_plan(counts: ModelCounts, layout: Layout, device: Accelerator, per_device_batch: int,
              microbatch: int | None = None, efficiency: float = DEFAULT_EFFICIENCY) -> Plan:
    """The plan for `microbatch` sequences per forward (None: the whole per-device batch, as "auto" starts)."""
    mb = microbatch or per_device_batch
    mem = memory(counts, layout, mb)
    other = memory(counts, _with_ac(layout, not layout.activation_checkpointing), mb)
    budget = device.memory_gb * GB * USABLE_FRACTION
    largest, size = 0, per_device_batch
    while size >= 1:
        if memory(counts, layout, size).total <= budget:
            largest = size
            break
        size //= 2
    fits = mem.total <= budget
    warnings = []
    if not fits:
        warnings.append(_does_not_fit(mem, other, layout, device, budget, mb, largest))
    if device.note:
        warnings.append(device.note)
    return Plan(counts, layout, device, mb, mem, other, efficiency, device.peak(layout.precision), fits, largest,
                warnings)


def _with_ac(layout: Layout, on: bool) -> Layout:
    return Layout(layout.world_size, layout.sharding, layout.shard_degree, layout.tp_degree, layout.precision, on)


def _does_not_fit(mem: Memory, other: Memory, layout: Layout, device: Accelerator, budget: float, mb: int,
                  largest: int) -> str:
    """One line: by how much the plan misses, and the changes that would make it fit."""
    need, have = mem.total / GB, budget / GB
    hints = []
    states = mem.weights + mem.gradients + mem.optimizer + mem.working_copies
    if states > budget:
        if layout.sharding in ("ddp", "none", "shard_grad_op"):
            hints.append("sharding the weights and states (parallelism: fsdp)")
        hints.append(f"more devices per shard group or a larger GPU (weights, gradients and AdamW states alone "
                     f"take {states / GB:.1f} GB per device)")
    else:
        if largest:
            hints.append(f"a microbatch of {largest} (device_train_microbatch_size={largest}, or auto)")
        if not layout.activation_checkpointing and other.total <= budget:
            hints.append(f"activation checkpointing ({other.total / GB:.1f} GB)")
    return (f"does not fit: {need:.1f} GB per device needed with microbatch {mb}, {have:.1f} GB usable on "
            f"{device.name} ({USABLE_FRACTION:.0%} of {device.memory_gb:g} GB); try: " + "; or ".join(hints))
