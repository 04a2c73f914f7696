"""RNG states in a checkpoint: capture and restore every generator, and derive states for new ranks.

RNG for ranks that did not exist at save time (`derive_rng_state`): a resumed run with more ranks than
the saved one needs RNG states for the new ranks. Rank r >= saved world size gets a state derived from
the saved rank-0 state and r: seed = xxh64(b"tessera-rng/1" + rank-0 torch CPU state + r as 8 bytes,
little-endian); python's `random` gets `Random(seed)`, numpy's legacy global generator gets
`RandomState(MT19937(seed))`, torch CPU `manual_seed(seed mod 2**63)`, CUDA device d seed + d + 1. The
same saved state and rank always give the same streams; different ranks get independent ones.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import xxhash

_RNG_TAG = b"tessera-rng/1"


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: python `random`, numpy's global generator, torch CPU and CUDA.

    Only plain types and tensors, so it loads with `torch.load(weights_only=True)`.
    """
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = ([torch.cuda.get_rng_state(d) for d in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else [])
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss),
                      float(cached)],
            "torch": torch.get_rng_state(), "cuda": cuda}


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set every generator `capture_rng_state` covers; CUDA states beyond the visible devices are skipped."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        for device, cuda_state in enumerate(state.get("cuda") or []):
            if device < torch.cuda.device_count():
                torch.cuda.set_rng_state(cuda_state, device)


def derive_rng_state(rank0_state: dict[str, Any], rank: int) -> dict[str, Any]:
    """A deterministic RNG state for `rank`, derived from the saved rank-0 state (see module docstring)."""
    digest = xxhash.xxh64(_RNG_TAG)
    digest.update(rank0_state["torch"].numpy().tobytes())
    digest.update(int(rank).to_bytes(8, "little"))
    seed = digest.intdigest()
    version, internal, gauss = random.Random(seed).getstate()
    kind, keys, pos, has_gauss, cached = np.random.RandomState(np.random.MT19937(seed)).get_state()
    torch_state = torch.Generator().manual_seed(seed % 2**63).get_state()
    devices = len(rank0_state.get("cuda") or []) if torch.cuda.is_available() else 0
    devices = min(devices, torch.cuda.device_count()) if devices else 0
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
            "torch": torch_state,
            "cuda": [_cuda_state_for_seed((seed + d + 1) % 2**63, d) for d in range(devices)]}


def _cuda_state_for_seed(seed: int, device: int) -> torch.Tensor:
    generator = torch.Generator(device=f"cuda:{device}")
    generator.manual_seed(seed)
    return generator.get_state()
