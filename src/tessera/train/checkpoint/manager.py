"""`CheckpointManager`: the one object a training loop talks to about checkpoints.

    ckpt = CheckpointManager("s3://bucket/runs/{run_name}/checkpoints", run_name="gpt-125m", num_to_keep=3)
    state = ckpt.latest(model=model, optimizers=[opt])            # None on a fresh run
    ...
    ckpt.save(capture_state(model, [opt], [sched], scaler, timestamp=ts, dataloader=loader.state_dict()), ts)
    ...
    ckpt.wait()                                                   # before exiting

Four verbs: `save` (stage in host memory, then write, upload and commit on one background thread),
`latest` (the newest valid checkpoint, falling back past damaged ones), `load` (one named checkpoint or
another run's), `retain` (delete what the retention settings drop; runs after every commit). The
protocol, the files, what one save holds (save_job.py), the state layout and retention live in the
sibling modules; this class owns the thread, the one save in flight, and the agreement between ranks
(see the package docstring).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tessera.storage import StorageError, Store, open_store
from tessera.train.checkpoint.commit import commit, fetch, upload_folder, wait_for_ranks
from tessera.train.checkpoint.files import read_state, write_state_files
from tessera.train.checkpoint.layout import (
    DCP_DIR,
    MANIFEST,
    META,
    MODEL,
    TRAIN_STATE,
    CheckpointCorrupt,
    CheckpointInfo,
    CheckpointManifest,
    CheckpointNotFound,
    CheckpointWarning,
    checkpoint_name,
    done_file,
    is_checkpoint_name,
    list_checkpoints,
    make_done,
    newest_first,
    none_usable,
    rank_file,
    read_pointer,
    resume_order,
)
from tessera.train.checkpoint.retention import prune
from tessera.train.checkpoint.save_job import SaveJob, stage_save
from tessera.train.checkpoint.state import has_dtensor
from tessera.train.checkpoint.throttle import WRITER_NICE, default_upload_threads, lower_thread_priority
from tessera.train.distributed import destroy_group
from tessera.train.time import Timestamp

log = logging.getLogger(__name__)


@dataclass
class _Fetched:
    name: str
    url: str
    manifest: CheckpointManifest
    local: Path
    own_rank_file: str | None


class CheckpointManager:
    """Saves, uploads, commits, prunes and loads the checkpoints of one run (package docstring).

    `save_folder`: any `open_store` URL or local path; "{run_name}" in it is replaced by `run_name`
    (default: the RUN_NAME environment variable). `num_to_keep`: committed checkpoints kept in the
    store (None keeps all); `keep_every_n`: also keep those whose batch count is a multiple of it (by
    batch, so the choice is stable across restarts). `sharded`: None saves through DCP when the state
    holds DTensors (FSDP2), True always, False never. `allow_pickle`: load files holding arbitrary
    Python objects (only from buckets you trust); by default only tensors and plain containers load.
    `store` overrides the store opened from `save_folder`. `upload_threads` (default: by cores per
    local rank) and `writer_nice` bound the background writer's share of the CPU (throttle.py).

    Under torch.distributed, every rank constructs the manager (it creates a gloo group of its own and
    agrees on a save id), and calls `save`, `latest` and `load` at the same points.
    """

    def __init__(self, save_folder: str | os.PathLike[str], run_name: str | None = None, *,
                 num_to_keep: int | None = None, keep_every_n: int | None = None, async_save: bool = True,
                 sharded: bool | None = None, on_saved: Callable[[CheckpointInfo], None] | None = None,
                 store: Store | None = None, staging_dir: str | os.PathLike[str] | None = None,
                 allow_pickle: bool = False, commit_timeout: float = 1800.0, upload_threads: int | None = None,
                 writer_nice: int = WRITER_NICE) -> None:
        if num_to_keep is not None and num_to_keep < 1:
            raise ValueError(f"num_to_keep must be >= 1 or None (keep all), got {num_to_keep}")
        if keep_every_n is not None and keep_every_n < 1:
            raise ValueError(f"keep_every_n must be >= 1 or None, got {keep_every_n}")
        self.run_name = run_name or os.environ.get("RUN_NAME", "")
        folder = os.fspath(save_folder)
        if "{run_name}" in folder and not self.run_name:
            raise ValueError(f"save_folder {folder!r} contains {{run_name}}, but no run_name was given "
                             f"and RUN_NAME is not set")
        self.save_folder = folder.replace("{run_name}", self.run_name)
        self.store = store if store is not None else open_store(self.save_folder)
        self.num_to_keep, self.keep_every_n = num_to_keep, keep_every_n
        self.async_save, self.sharded, self.allow_pickle = async_save, sharded, allow_pickle
        self.staging_dir = None if staging_dir is None else os.fspath(staging_dir)
        self.commit_timeout = commit_timeout
        self.callbacks: list[Callable[[CheckpointInfo], None]] = [on_saved] if on_saved else []

        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        # A gloo group of our own: background DCP saves and load agreement never share a queue with
        # the training loop's collectives (and work whatever the default backend is).
        self._pg = dist.new_group(backend="gloo") if distributed and self.world_size > 1 else None
        nonce = [uuid.uuid4().hex]
        if self._pg is not None:
            dist.broadcast_object_list(nonce, src=0, group=self._pg)
        self._nonce, self._seq = nonce[0], 0
        self.upload_threads = upload_threads or default_upload_threads()
        self.writer_nice = writer_nice
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessera-ckpt",
                                        initializer=self._lower_priority)
        self._pending: Future[CheckpointInfo] | None = None
        self._staging: dict[tuple, Any] = {}  # host buffers reused across saves (see save_job.stage_save)
        self._last_committed: str | None = None  # written by the save thread, read after wait()

    # --- save ------------------------------------------------------------------------------------------

    def save(self, state: dict[str, Any], timestamp: Timestamp | None = None) -> None:
        """Stage `state` (see `capture_state`) in host memory, start writing it, and return.

        Every rank calls this at the same step. Blocks only while a previous save is still in flight.
        """
        start = time.perf_counter()
        self.wait()
        if timestamp is None:
            timestamp = Timestamp.from_state_dict(state["timestamp"])
        sharded = self.sharded
        if sharded is None:
            sharded = bool(state.get("sharded")) or has_dtensor(state.get("model"))
        name = checkpoint_name(timestamp)
        if name == self._last_committed:  # e.g. an interval save and the final save on the same batch
            log.debug("checkpoint %s is already saved; skipping", name)
            return
        self._seq += 1
        job = stage_save(state, timestamp, name, rank=self.rank, world_size=self.world_size, sharded=sharded,
                         nonce=f"{self._nonce}-{self._seq}", staging=self._staging)
        job.stall_seconds = time.perf_counter() - start
        self._pending = self._pool.submit(self._write, job)
        if not self.async_save:
            self.wait()

    def _lower_priority(self) -> None:
        lower_thread_priority(self.writer_nice)

    def wait(self) -> CheckpointInfo | None:
        """Block until the save in flight (if any) is done; re-raise its error."""
        future, self._pending = self._pending, None
        return None if future is None else future.result()

    def close(self) -> None:
        """Finish the save in flight, join the background thread, then leave the manager's gloo group (its
        threads end here, not at interpreter exit). The manager is not used after it. Idempotent."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            group, self._pg = self._pg, None
            destroy_group(group)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, job: SaveJob) -> CheckpointInfo:
        start = time.perf_counter()
        folder = self.store.child(job.name)
        if self.rank == 0:
            folder.delete(MANIFEST)  # a stale folder of the same name is uncommitted before anything changes
        local = Path(tempfile.mkdtemp(prefix=f"tessera-save-{job.name}-r{self.rank}-", dir=self.staging_dir))
        try:
            write_state_files(local, job.files, job.meta, job.dcp, self._pg)
            job.files, job.dcp = {}, None  # release the staged copy before the upload
            entries = upload_folder(folder, local, self.upload_threads, self._lower_priority)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        deleted: tuple[str, ...] = ()
        if self.rank == 0:
            entries += wait_for_ranks(folder, job.nonce, range(1, self.world_size), self.commit_timeout)
            manifest = CheckpointManifest(name=job.name, timestamp=job.timestamp.state_dict(),
                                          world_size=self.world_size, sharded=job.sharded,
                                          files=sorted(entries, key=lambda e: e.key))
            commit(self.store, manifest)
            entries = manifest.files
            deleted = self.retain(job.name)
        else:
            folder.put(done_file(self.rank), make_done(job.nonce, entries))
        info = CheckpointInfo(name=job.name, url=folder.url, timestamp=job.timestamp, rank=self.rank,
                              committed=self.rank == 0, files=tuple(entries),
                              bytes=sum(e.size for e in entries), stall_seconds=job.stall_seconds,
                              write_seconds=time.perf_counter() - start, deleted=deleted)
        self._last_committed = job.name
        for callback in self.callbacks:
            try:
                callback(info)
            except Exception:  # a failing observer must not fail the checkpoint
                log.exception("on_saved callback %r failed for %s", callback, info.url)
        return info

    def retain(self, current: str | None = None) -> tuple[str, ...]:
        """Delete the checkpoints that `num_to_keep` / `keep_every_n` drop; the names deleted.

        Runs on the save thread after every commit (`current` = the checkpoint just committed; default:
        the pointer's target). A storage error is logged, not raised: retention must not fail a
        committed save, and the next save retries.
        """
        if self.num_to_keep is None or self.rank != 0:
            return ()
        try:
            current = current or read_pointer(self.store)
            return () if current is None else prune(self.store, current, self.num_to_keep, self.keep_every_n)
        except StorageError as exc:
            log.warning("checkpoint retention in %s failed: %s", self.store.url, exc)
            return ()

    # --- load ------------------------------------------------------------------------------------------

    def checkpoints(self) -> list[str]:
        """Checkpoint folder names in the store, newest first (committed or not)."""
        return newest_first(list_checkpoints(self.store))

    def latest(self, *, model: torch.nn.Module | None = None, optimizers: Sequence[torch.optim.Optimizer] = (),
               weights_only: bool = False, strict: bool = True) -> dict[str, Any] | None:
        """The newest valid checkpoint's state, or None when the store has no checkpoint at all.

        Falls back past damaged ones with a `CheckpointWarning`; raises CheckpointCorrupt if checkpoints
        exist but none is usable. Pass `model`/`optimizers` to reshard a sharded checkpoint into them.
        """
        self.wait()
        return self._load_newest(self.store, model, optimizers, weights_only, strict)

    def load(self, path: str | os.PathLike[str] | None = None, *, model: torch.nn.Module | None = None,
             optimizers: Sequence[torch.optim.Optimizer] = (), weights_only: bool = False,
             strict: bool = True) -> dict[str, Any]:
        """Load one checkpoint and return its state (apply it with `apply_state`).

        `path`: None = the newest valid checkpoint of this manager's folder; a name ("ep1-ba500") in
        it; a URL or path to a checkpoint folder (ending in its name), loaded exactly, no fallback; or
        a URL of another run's checkpoint root (pointer + fallback). `weights_only` returns only the
        model (and timestamp, config). `strict` is passed to the model's load.
        """
        self.wait()
        if path is None:
            store, name = self.store, None
        else:
            text = os.fspath(path).rstrip("/")
            if is_checkpoint_name(text):
                store, name = self.store, text
            elif is_checkpoint_name(text.rsplit("/", 1)[-1]):
                root, name = text.rsplit("/", 1)
                store = open_store(root or "/")
            else:
                store, name = open_store(text), None
        if name is None:
            state = self._load_newest(store, model, optimizers, weights_only, strict)
            if state is None:
                raise CheckpointNotFound(f"{store.url}: no checkpoint here; check the path or save first",
                                         store.url)
            return state
        fetched = self._agreed_fetch(store, name, weights_only)
        return self._materialize(fetched, model, optimizers, weights_only, strict)

    def _load_newest(self, store: Store, model: torch.nn.Module | None,
                     optimizers: Sequence[torch.optim.Optimizer], weights_only: bool,
                     strict: bool) -> dict[str, Any] | None:
        """The newest checkpoint every rank verifies; None when nothing was ever committed. Warnings wait
        for the outcome: one line per checkpoint skipped once one loads, one error if none does."""
        notes: list[str] = []  # the pointer's, said only where the run goes on
        candidates, committed = self._broadcast(resume_order(store, notes.append) if self.rank == 0 else None)
        refused: list[tuple[str, str]] = []  # (name, why), newest first
        for name in candidates:
            try:
                fetched = self._agreed_fetch(store, name, weights_only)
            except CheckpointCorrupt as exc:  # why, with the folder's URL shortened to its name
                refused.append((name, str(exc).replace(store.url_for(name), name)))
                continue
            for message in notes + [f"checkpoint {store.url_for(skipped)} is unusable ({why}); resuming from "
                                    f"{name}" for skipped, why in refused]:
                self._warn(message)
            return self._materialize(fetched, model, optimizers, weights_only, strict)
        if candidates and committed:
            raise none_usable(store.url, [why for _, why in refused])
        for message in notes:
            self._warn(message)
        if candidates:  # only saves that died before their commit (e.g. killed during the first one)
            self._warn(f"{store.url}: no committed checkpoint, only partial ones "
                       f"({'; '.join(why for _, why in refused)}); starting from the beginning")
        return None

    def _agreed_fetch(self, store: Store, name: str, weights_only: bool) -> _Fetched:
        """Download and verify on every rank; succeed only if every rank succeeded."""
        fetched, error = None, None
        try:
            fetched = self._fetch(store, name, weights_only)
        except CheckpointCorrupt as exc:
            error = exc
        if not self._all_ok(error is None):
            if fetched is not None:
                shutil.rmtree(fetched.local, ignore_errors=True)
            raise error or CheckpointCorrupt(f"{store.url_for(name)}: another rank could not verify it",
                                             store.url_for(name))
        assert fetched is not None
        return fetched

    def _fetch(self, store: Store, name: str, weights_only: bool) -> _Fetched:
        own: list[str] = []

        def needed(manifest: CheckpointManifest) -> list[str]:
            keys = [META] + ([k for k in manifest.entries() if k.startswith(DCP_DIR + "/")]
                             if manifest.sharded else [MODEL])
            if not weights_only:
                own.append(rank_file(self.rank if self.rank < manifest.world_size else 0))
                keys += [TRAIN_STATE, own[0]]
            return keys

        local = Path(tempfile.mkdtemp(prefix=f"tessera-load-{name}-r{self.rank}-", dir=self.staging_dir))
        try:
            # Rank 0 also hashes the files only other ranks read (their RNG and dataloader states).
            manifest = fetch(store, name, needed, local, verify_rest=self.rank == 0 and not weights_only,
                             show_progress=self.rank == 0)
        except BaseException:
            shutil.rmtree(local, ignore_errors=True)
            raise
        return _Fetched(name=name, url=store.url_for(name), manifest=manifest, local=local,
                        own_rank_file=own[0] if own else None)

    def _materialize(self, fetched: _Fetched, model: torch.nn.Module | None,
                     optimizers: Sequence[torch.optim.Optimizer], weights_only: bool,
                     strict: bool) -> dict[str, Any]:
        manifest = fetched.manifest
        derived = not weights_only and self.rank >= manifest.world_size
        try:
            state = read_state(fetched.local, sharded=manifest.sharded, rank_file=fetched.own_rank_file,
                               derive_rng_for=self.rank if derived else None, model=model,
                               optimizers=optimizers, strict=strict, process_group=self._pg,
                               allow_pickle=self.allow_pickle)
        finally:
            shutil.rmtree(fetched.local, ignore_errors=True)
        state["timestamp"] = dict(manifest.timestamp)
        state["checkpoint"] = {"name": fetched.name, "url": fetched.url, "world_size": manifest.world_size,
                               "rng_derived": derived}
        log.info("loaded checkpoint %s", fetched.url)
        return state

    # --- agreement between ranks ----------------------------------------------------------------------

    def _broadcast(self, value: Any) -> Any:
        if self._pg is None:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0, group=self._pg)
        return box[0]

    def _all_ok(self, ok: bool) -> bool:
        if self._pg is None:
            return ok
        import torch.distributed as dist

        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._pg)
        return bool(flag.item())

    def _warn(self, message: str) -> None:
        """Rank 0 decides, so rank 0 warns (route to logs with `logging.captureWarnings(True)`)."""
        if self.rank == 0:
            warnings.warn(message, CheckpointWarning, stacklevel=3)
        else:
            log.info(message)
