"""One save as the background thread receives it: what each rank writes, already copied to host memory.

Kept apart from the manager (which owns the thread, the one save in flight and the agreement between
ranks) because this is the checkpoint's content, decided on the training thread: every rank writes its
own RNG and dataloader state; rank 0 also meta.json, the train state (schedulers, scaler) and, unless
the save is sharded, the model and optimizers; a sharded save hands those to DCP instead. Everything is
staged to host memory (`stage_to_host`) before `save` returns, so the loop may change the model while
the thread writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera.train.checkpoint.layout import MODEL, TRAIN_STATE, meta_json, rank_file
from tessera.train.checkpoint.rng import capture_rng_state
from tessera.train.checkpoint.state import stage_to_host
from tessera.train.time import Timestamp


@dataclass
class SaveJob:
    """A staged save: its checkpoint name, the files of this rank, the DCP state when sharded, and rank 0's
    meta.json; `nonce` ties this rank's done file to this save (commit.py)."""

    name: str
    timestamp: Timestamp
    sharded: bool
    nonce: str
    files: dict[str, Any]
    dcp: dict[str, Any] | None
    meta: bytes | None
    stall_seconds: float = 0.0


def stage_save(state: dict[str, Any], timestamp: Timestamp, name: str, *, rank: int, world_size: int,
               sharded: bool, nonce: str, staging: dict[tuple, Any]) -> SaveJob:
    """The save of `state` (see `capture_state`) by this rank, copied into the reused host buffers `staging`."""
    files: dict[str, Any] = {rank_file(rank): {"rng": state.get("rng") or capture_rng_state(),
                                               "dataloader": state.get("dataloader")}}
    meta = None
    if rank == 0:
        meta = meta_json(name, timestamp, world_size, sharded, state.get("config") or {})
        train_state = {"schedulers": list(state.get("schedulers") or []), "scaler": state.get("scaler")}
        if not sharded:
            files[MODEL] = state["model"]
            train_state["optimizers"] = list(state.get("optimizers") or [])
        files[TRAIN_STATE] = train_state
    dcp_state = {"model": state["model"], "optimizers": list(state.get("optimizers") or [])}
    return SaveJob(name=name, timestamp=timestamp, sharded=sharded, nonce=nonce,
                   files=stage_to_host(files, staging, ("files",)),
                   dcp=stage_to_host(dcp_state, staging, ("dcp",)) if sharded else None,
                   meta=meta)
