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

- weights: N x w / (s x t), w = 4 (fp32; they stay fp32 under autocast) or 2 (`pure_bf16`), or the
  bytes of the dtype a pretrained model is loaded in (`ModelCounts.weight_bytes`: a LoRA base in bf16 is
  2, its adapters follow the base). DDP keeps them whole (s = 1 for weights); every FSDP strategy stores
  them sharded over the shard group.
- working copies: the weights the step computes with, besides the stored ones. DDP under autocast keeps
  a cast of every weight for the forward (autocast's cache, N x 2 / t); FSDP `full_shard` and `hybrid`
  gather one block at a time and prefetch the next (two blocks in `param_dtype`, fp32 without one);
  `shard_grad_op` keeps every gathered block from forward to backward (N in `param_dtype` / t).
- gradients: T x w / (s x t), sharded by every FSDP strategy, whole under DDP.
- optimizer state: AdamW's two moments in the weights' dtype, T x 2w / (s x t).
- activations, kept for the backward, per layer and token: 34 x d_model bytes at 16-bit (Korthikanti et
  al. 2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 2, with a fused attention
  kernel so the 5 x heads x L / d_model term of the scores is gone), doubled at fp32, divided by t
  (tensor parallelism with sequence parallelism). A checkpointed layer keeps only its input (2 x d_model
  at 16-bit) and one layer is recomputed at a time (its full 34 x d_model); `every_n` checkpoints every
  n-th layer; `selective` (op-level) is counted as keeping half of a layer (17 x d_model), the attention
  and every other matmul output. Plus the output layer: logits in the compute dtype and an fp32 copy for
  the cross-entropy, vocab x (bytes + 4) per token. All of it x m x L tokens.

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

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from tessera.train.hardware import DTYPE_OF_PRECISION, Accelerator

GB = 1e9
USABLE_FRACTION = 0.9
DEFAULT_EFFICIENCY = 0.45  # assumed hardware FLOPs utilisation of a well-tuned dense transformer step
ACT_BYTES_PER_TOKEN_LAYER_16BIT = 34  # x d_model; Korthikanti et al. 2022 without the attention-score term
CHECKPOINTED_BYTES_16BIT = 2  # x d_model: a checkpointed layer keeps its input only
SELECTIVE_BYTES_16BIT = 17  # x d_model: op-level checkpointing keeps about half of a layer
Sharding = Literal["none", "ddp", "full_shard", "shard_grad_op", "hybrid"]
FSDP = ("full_shard", "shard_grad_op", "hybrid")


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
    weight_bytes: int = 0  # bytes per stored weight when the model fixes its dtype; 0: the precision's


@dataclass(frozen=True)
class Layout:
    """How the run spreads over devices: the plain numbers the memory maths needs."""

    world_size: int = 1
    sharding: Sharding = "ddp"
    shard_degree: int = 1  # devices one FSDP shard group spans (hybrid: within a node; full_shard: all)
    tp_degree: int = 1
    precision: str = "amp_bf16"  # a Trainer precision: fp32, amp_bf16, amp_fp16, pure_bf16
    activation_checkpointing: bool | str = False  # True/"full", "every_n", "selective"; False/"none"
    checkpoint_every: int = 1  # every_n: every n-th layer is checkpointed
    param_dtype: str | None = None  # FSDP's compute dtype for gathered weights (bfloat16...); None: theirs

    def __post_init__(self) -> None:
        if self.tp_degree < 1 or self.shard_degree < 1 or self.world_size < 1:
            raise ValueError("world_size, shard_degree and tp_degree must be >= 1")
        if self.world_size % self.tp_degree:
            raise ValueError(f"tensor-parallel degree {self.tp_degree} does not divide {self.world_size} devices")

    @property
    def ac_mode(self) -> str:
        mode = self.activation_checkpointing
        return {True: "full", False: "none"}.get(mode, mode) if isinstance(mode, bool) else mode

    @property
    def shard(self) -> int:
        """Over how many devices weights, gradients and optimizer states are split (besides TP)."""
        return self.shard_degree if self.sharding in FSDP else 1

    def with_ac(self, mode: bool | str) -> Layout:
        return replace(self, activation_checkpointing=mode)


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
        """Hardware FLOPs over model FLOPs: a checkpointed layer runs its forward (2N of 6N) twice."""
        mode, n = self.layout.ac_mode, self.counts.n_layers
        share = {"none": 0.0, "full": 1.0, "selective": 0.5,
                 "every_n": math.ceil(n / max(1, self.layout.checkpoint_every)) / max(1, n)}.get(mode, 1.0)
        return 1.0 + share * 2 / 6


_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1}


def _compute_bytes(layout: Layout) -> int:
    """Bytes of an activation: 2 under autocast, pure bf16 or an FSDP param_dtype of 16 bits, else 4."""
    if layout.param_dtype is not None and _BYTES.get(layout.param_dtype, 4) == 2:
        return 2
    return _BYTES.get(DTYPE_OF_PRECISION.get(layout.precision, layout.precision), 4)


def weight_bytes(counts: ModelCounts, layout: Layout) -> int:
    """Bytes of a stored weight, gradient and Adam moment: the model's fixed dtype, else the precision's."""
    return counts.weight_bytes or (2 if layout.precision == "pure_bf16" else 4)


def memory(counts: ModelCounts, layout: Layout, microbatch: int) -> Memory:
    """Bytes per device for one microbatch of `microbatch` sequences (see the module docstring)."""
    t, act_bytes = layout.tp_degree, _compute_bytes(layout)
    w = weight_bytes(counts, layout)
    gathered = _BYTES.get(layout.param_dtype or "", w)
    weights = counts.params * w / (layout.shard * t)
    if layout.sharding in ("full_shard", "hybrid") and layout.shard > 1:
        block = counts.block_params or counts.params / max(1, counts.n_layers)
        working = 2 * block * gathered / t  # the gathered block and the prefetched next one
    elif layout.sharding == "shard_grad_op" and layout.shard > 1:
        working = counts.params * gathered / t  # gathered blocks stay until their backward
    else:
        working = counts.params * 2 / t if w == 4 and act_bytes == 2 else 0.0  # autocast's cast of every weight
    gradients = counts.trainable * w / (layout.shard * t)
    optimizer = counts.trainable * 2 * w / (layout.shard * t)
    scale = act_bytes / 2
    full_layer = ACT_BYTES_PER_TOKEN_LAYER_16BIT * counts.d_model * scale / t
    kept = {"full": CHECKPOINTED_BYTES_16BIT, "every_n": CHECKPOINTED_BYTES_16BIT,
            "selective": SELECTIVE_BYTES_16BIT}.get(layout.ac_mode)
    if kept is None:
        per_token = counts.n_layers * full_layer
    else:
        every = layout.checkpoint_every if layout.ac_mode == "every_n" else 1
        checkpointed = math.ceil(counts.n_layers / max(1, every))
        per_token = (checkpointed * kept * counts.d_model * scale / t
                     + (counts.n_layers - checkpointed) * full_layer + full_layer)  # + the layer being recomputed
    per_token += counts.vocab_size * (act_bytes + 4) / t  # logits and the fp32 copy the loss reads
    return Memory(weights, working, gradients, optimizer, per_token * microbatch * counts.seq_len)


def make_plan(counts: ModelCounts, layout: Layout, device: Accelerator, per_device_batch: int,
              microbatch: int | None = None, efficiency: float = DEFAULT_EFFICIENCY) -> Plan:
    """The plan for `microbatch` sequences per forward (None: the whole per-device batch, as "auto" starts)."""
    mb = microbatch or per_device_batch
    mem = memory(counts, layout, mb)
    other = memory(counts, layout.with_ac("none" if layout.ac_mode != "none" else "full"), mb)
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


def _does_not_fit(mem: Memory, other: Memory, layout: Layout, device: Accelerator, budget: float, mb: int,
                  largest: int) -> str:
    """One line: by how much the plan misses, and the changes that would make it fit."""
    need, have = mem.total / GB, budget / GB
    hints = []
    states = mem.weights + mem.gradients + mem.optimizer + mem.working_copies
    if states > budget:
        if layout.sharding in ("ddp", "none"):
            hints.append("sharding the weights and states (parallelism: fsdp)")
        hints.append(f"more devices per shard group or a larger GPU (weights, gradients and AdamW states alone "
                     f"take {states / GB:.1f} GB per device)")
    else:
        if largest:
            hints.append(f"a microbatch of {largest} (device_train_microbatch_size={largest}, or auto)")
        if layout.ac_mode == "none" and other.total <= budget:
            hints.append(f"activation checkpointing ({other.total / GB:.1f} GB)")
    return (f"does not fit: {need:.1f} GB per device needed with microbatch {mb}, {have:.1f} GB usable on "
            f"{device.name} ({USABLE_FRACTION:.0%} of {device.memory_gb:g} GB); try: " + "; or ".join(hints))
