"""Accelerators by name: peak FLOP/s per precision and memory, in one table.

Two readers use it. `tessera train RECIPE --plan --gpu H100` picks an entry by its plan name (memory and
peaks decide whether a run fits and what it should reach); the training loop matches the name CUDA reports
(`torch.cuda.get_device_name`) against each entry's patterns to turn tokens/s into MFU. Figures are the
vendors' dense (no 2:4 sparsity) tensor-core peaks of the SXM parts; `fp32` is plain IEEE fp32 (what torch
runs unless `torch.backends.cuda.matmul.allow_tf32` is set), `tf32` the tensor-core rate. A CPU, or a GPU
missing from the table, has no peak: MFU is then left out rather than guessed.

Trainium (`trn1`) counts one Trainium chip (two NeuronCores, 32 GB) as a device; its figures are
indicative, since torch-neuronx compiles the graph and reaches other efficiencies than CUDA does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TERA = 1e12


@dataclass(frozen=True)
class Accelerator:
    """One device type: memory and dense peak FLOP/s by dtype (`bf16`, `fp16`, `fp8`, `tf32`, `fp32`)."""

    name: str
    memory_gb: float  # usable HBM as sold (GB = 1e9 bytes)
    peak_flops: dict[str, float]
    patterns: tuple[str, ...] = ()  # substrings of torch.cuda.get_device_name() that mean this device
    gpus_per_node: int = 8
    note: str = ""
    aliases: tuple[str, ...] = field(default=())

    def peak(self, dtype: str) -> float | None:
        """Peak FLOP/s at `dtype` (a dtype or a Trainer precision: amp_bf16 -> bf16), or None."""
        return self.peak_flops.get(DTYPE_OF_PRECISION.get(dtype, dtype))


# The plan's names first (what --gpu accepts); runtime-only entries after. Longer patterns first, so that
# "H100 PCIe" is not taken for the SXM "H100".
ACCELERATORS: list[Accelerator] = [
    Accelerator("A100-40GB", 40, {"bf16": 312 * TERA, "fp16": 312 * TERA, "tf32": 156 * TERA, "fp32": 19.5 * TERA},
                patterns=("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB")),
    Accelerator("A100-80GB", 80, {"bf16": 312 * TERA, "fp16": 312 * TERA, "tf32": 156 * TERA, "fp32": 19.5 * TERA},
                patterns=("A100",)),
    Accelerator("H100", 80, {"fp8": 1979 * TERA, "bf16": 989 * TERA, "fp16": 989 * TERA, "tf32": 495 * TERA,
                             "fp32": 67 * TERA}, patterns=("H100 80GB HBM3", "H100 SXM")),
    Accelerator("H200", 141, {"fp8": 1979 * TERA, "bf16": 989 * TERA, "fp16": 989 * TERA, "tf32": 495 * TERA,
                              "fp32": 67 * TERA}, patterns=("H200", "GH200")),
    Accelerator("trn1", 32, {"fp8": 190 * TERA, "bf16": 190 * TERA, "fp16": 190 * TERA, "tf32": 190 * TERA,
                             "fp32": 47.5 * TERA}, gpus_per_node=16,
                note="Trainium figures are indicative: one device is one Trainium chip (2 NeuronCores); "
                     "torch-neuronx compiles the step and its efficiency differs from CUDA's"),
    # Seen at run time only (MFU of the devices people have), not offered by --plan.
    Accelerator("H100-PCIe", 80, {"fp8": 1513 * TERA, "bf16": 756 * TERA, "fp16": 756 * TERA, "fp32": 51 * TERA},
                patterns=("H100 PCIe",)),
    Accelerator("H100-NVL", 94, {"fp8": 1670 * TERA, "bf16": 835 * TERA, "fp16": 835 * TERA, "fp32": 60 * TERA},
                patterns=("H100 NVL",)),
    Accelerator("H100-other", 80, {"fp8": 1979 * TERA, "bf16": 989 * TERA, "fp16": 989 * TERA, "fp32": 67 * TERA},
                patterns=("H100",)),
    Accelerator("B200", 180, {"fp8": 4500 * TERA, "bf16": 2250 * TERA, "fp16": 2250 * TERA, "fp32": 75 * TERA},
                patterns=("B200",)),
    Accelerator("L40S", 48, {"fp8": 733 * TERA, "bf16": 362 * TERA, "fp16": 362 * TERA, "fp32": 91.6 * TERA},
                patterns=("L40S",)),
    Accelerator("A10", 24, {"bf16": 125 * TERA, "fp16": 125 * TERA, "fp32": 31.2 * TERA}, patterns=("A10",)),
    Accelerator("L4", 24, {"fp8": 242 * TERA, "bf16": 121 * TERA, "fp16": 121 * TERA, "fp32": 30.3 * TERA},
                patterns=("L4",)),
    Accelerator("V100", 32, {"fp16": 125 * TERA, "fp32": 15.7 * TERA}, patterns=("V100",)),
    Accelerator("T4", 16, {"fp16": 65 * TERA, "fp32": 8.1 * TERA}, patterns=("T4",)),
    Accelerator("MI300X", 192, {"fp8": 2615 * TERA, "bf16": 1307 * TERA, "fp16": 1307 * TERA, "fp32": 163.4 * TERA},
                patterns=("MI300X",)),
    Accelerator("MI250X", 128, {"bf16": 383 * TERA, "fp16": 383 * TERA, "fp32": 47.9 * TERA}, patterns=("MI250X",)),
]
PLAN_GPUS = ("A100-40GB", "A100-80GB", "H100", "H200", "trn1")
DTYPE_OF_PRECISION = {"amp_bf16": "bf16", "amp_fp16": "fp16", "pure_bf16": "bf16", "fp32": "fp32"}


def accelerator(name: str) -> Accelerator:
    """The entry named `name` (case-insensitive); ValueError listing the plan's names otherwise."""
    for acc in ACCELERATORS:
        if acc.name.lower() == name.lower():
            return acc
    raise ValueError(f"unknown GPU type {name!r}; use one of {', '.join(PLAN_GPUS)}")


def match_device_name(device_name: str) -> Accelerator | None:
    """The entry whose pattern occurs in a CUDA device name ("NVIDIA A100-SXM4-80GB" -> A100-80GB)."""
    for acc in ACCELERATORS:
        if any(pattern in device_name for pattern in acc.patterns):
            return acc
    return None


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of one `device` at a Trainer `precision`; None on a CPU or an unlisted device."""
    import torch

    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    acc = match_device_name(torch.cuda.get_device_name(device))
    return acc.peak(precision) if acc is not None else None
