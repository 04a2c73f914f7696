"""Checkpoints in any bucket: async save, upload, manifest, pointer, retention, autoresume.

This package owns the whole checkpoint life cycle, one module per part:

    manager.py    `CheckpointManager`: save, latest, load, retain; the save thread and rank agreement
    save_job.py   what one save holds (each rank's files, rank 0's meta and train state), staged to host
    commit.py     the commit protocol (upload, done files, manifest, pointer) and the verified fetch
    retention.py  which checkpoints are kept, and deleting the others completely
    layout.py     folder layout, names, manifest, pointer, errors
    state.py      what goes in a checkpoint (`capture_state`, `apply_state`) and the host copy
    files.py      the torch files and DCP shards of one folder on local disk
    rng.py        RNG capture, restore and derivation for ranks that did not exist at save time
    throttle.py   the background writer's CPU share: upload threads, per-thread priority

    ckpt = CheckpointManager("s3://bucket/runs/{run_name}/checkpoints", run_name="gpt-125m", num_to_keep=3)
    state = ckpt.latest(model=model, optimizers=[opt])            # None on a fresh run
    if state is not None:
        apply_state(state, model, [opt], [sched], scaler)
        timestamp = Timestamp.from_state_dict(state["timestamp"])
    ...
    ckpt.save(capture_state(model, [opt], [sched], scaler, timestamp=ts, dataloader=loader.state_dict()), ts)
    ...
    ckpt.wait()                                                   # before exiting

Save, per rank: `save` copies the state to host memory and returns; one background thread writes the
files to a local staging folder (DCP for sharded states: each rank writes only its own shards, nothing
is gathered to rank 0), uploads them through `open_store`, and writes `rank{R}.done.json` listing them.
The writer runs at a lower priority with bounded upload threads, so it does not starve the loop. Rank 0 then waits for every rank's done file (by polling the store,
no barrier), confirms every file with a listing, writes `manifest.json`, confirms it, and only then
points `latest` at the new folder. Retention runs last. At most one save is in flight: `save` first
waits for the previous one and re-raises its error, as does `wait`.

Load: the pointer's target first, then every other folder newest first. A candidate is used only if
its manifest exists and every file it names has the right size and xxh64 hash; otherwise the previous
one is tried, and once one loads a `CheckpointWarning` per skipped folder names it and the reason. If
none loads, `latest` raises one `CheckpointCorrupt` listing every folder tried and why (no warnings
before it). If nothing was ever committed (no pointer, no manifest: every folder is a save killed before
its commit), `latest` warns and starts from the beginning rather than failing on every restart. Under several ranks, rank 0
picks the candidates and all ranks agree (all_reduce) before loading, so every rank resumes from the
same checkpoint.

Elastic resume: non-sharded states are world-size free; sharded ones are resharded by DCP into the
current model (pass `model=` and `optimizers=` to load). Ranks beyond the saved world size get the saved
rank-0 dataloader state and an RNG state derived from rank 0's (`derive_rng_state`).
"""

from tessera.train.checkpoint.layout import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointInfo,
    CheckpointManifest,
    CheckpointNotFound,
    CheckpointWarning,
    ManifestEntry,
    checkpoint_name,
)
from tessera.train.checkpoint.manager import CheckpointManager
from tessera.train.checkpoint.rng import capture_rng_state, derive_rng_state, restore_rng_state
from tessera.train.checkpoint.state import apply_state, capture_state, unwrap_model

__all__ = [
    "CheckpointCorrupt", "CheckpointError", "CheckpointInfo", "CheckpointManager", "CheckpointManifest",
    "CheckpointNotFound", "CheckpointWarning", "ManifestEntry", "apply_state", "capture_rng_state",
    "capture_state", "checkpoint_name", "derive_rng_state", "restore_rng_state", "unwrap_model",
]
