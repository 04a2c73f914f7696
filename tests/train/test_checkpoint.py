"""Checkpoints: bitwise round trips, async save, commit order, fallback, retention, DCP resharding.

Multi-process parts (a killed saver, 2 gloo ranks with FSDP2) run this file as a script:
`python test_checkpoint.py <role> ...` (see `main` at the bottom).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from tessera.storage import ObjectInfo, Store, open_store
from tessera.train.checkpoint import (
    CheckpointCorrupt,
    CheckpointManager,
    CheckpointNotFound,
    CheckpointWarning,
    apply_state,
    capture_rng_state,
    capture_state,
    derive_rng_state,
    restore_rng_state,
)
from tessera.train.checkpoint.retention import checkpoints_to_delete
from tessera.train.time import Timestamp

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
HERE = Path(__file__).resolve()
PYTHON = sys.executable


# --- a small real training setup ---------------------------------------------------------------------


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def make_training(seed: int = 0):
    model = make_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    return model, opt, sched


def train_steps(model, opt, sched, steps: int, ts: Timestamp) -> tuple[list[float], Timestamp]:
    """Steps that draw from every RNG, so a wrong RNG restore changes the losses."""
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 8) + random.random() + float(np.random.rand())
        loss = torch.nn.functional.dropout(model(x), 0.1).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        ts = ts.to_next_batch(16, 16 * 8)
    return losses, ts


def snapshot(model, opt, sched) -> dict:
    return {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "opt": _clone(opt.state_dict()),
            "sched": dict(sched.state_dict())}


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj


def assert_same(a, b, path: str = "") -> None:
    """Bitwise equality of nested states (tensors compared exactly, dtype included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def save_checkpoint(mgr: CheckpointManager, model, opt, sched, ts: Timestamp, **extra) -> None:
    mgr.save(capture_state(model, [opt], [sched], timestamp=ts, dataloader={"consumed": ts.sample},
                           config={"lr": 1e-2}, **extra), ts)


# --- a store wrapper for fault injection ---------------------------------------------------------------


class HookedStore(Store):
    """Delegates to `inner`, calling `hook(op, full_key)` before each operation (to sleep or fail)."""

    def __init__(self, inner: Store, hook: Callable[[str, str], None], prefix: str = "") -> None:
        self.inner, self.hook, self.prefix = inner, hook, prefix
        self.url, self.retry = inner.url, inner.retry

    def _h(self, op: str, key: str) -> None:
        self.hook(op, self.prefix + key)

    def get(self, key: str) -> bytes:
        self._h("get", key)
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._h("get", key)
        return self.inner.get_range(key, start, end)

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self._h("get", key)
        return self.inner.get_ranges(key, ranges)

    def put(self, key: str, data) -> None:
        self._h("put", key)
        self.inner.put(key, data)

    def put_file(self, key: str, path) -> None:
        self._h("put", key)
        self.inner.put_file(key, path)

    def _put_create(self, key: str, data) -> None:
        self._h("put", key)
        self.inner._put_create(key, data)

    def head(self, key: str) -> ObjectInfo:
        self._h("head", key)
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._h("list", prefix)
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._h("delete", key)
        self.inner.delete(key)

    def copy(self, src_key: str, dst_key: str) -> None:
        self.inner.copy(src_key, dst_key)

    def child(self, prefix: str) -> Store:
        return HookedStore(self.inner.child(prefix), self.hook, self.prefix + prefix.strip("/") + "/")

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)


@pytest.fixture
def memory_url(request) -> str:
    return f"memory://ckpt-{request.node.name.replace('[', '-').replace(']', '')}-{os.getpid()}-{time.time_ns()}"


# --- round trip --------------------------------------------------------------------------------------


def test_round_trip_is_bitwise_and_training_continues_identically(any_store_url):
    model, opt, sched = make_training()
    _, ts = train_steps(model, opt, sched, 3, Timestamp())
    mgr = CheckpointManager(any_store_url + "/{run_name}/ckpt", run_name="rt")
    save_checkpoint(mgr, model, opt, sched, ts)
    saved = snapshot(model, opt, sched)
    draws = (random.random(), float(np.random.rand()), torch.rand(3))
    info = mgr.wait()
    assert info.committed and info.name == "ep0-ba3" and {f.key for f in info.files} == {
        "meta.json", "model.pt", "train_state.pt", "rank0.pt"}
    reference, _ = train_steps(model, opt, sched, 3, ts)

    model2, opt2, sched2 = make_training(seed=1)
    state = CheckpointManager(any_store_url + "/rt/ckpt").latest()
    apply_state(state, model2, [opt2], [sched2])
    assert_same(saved, snapshot(model2, opt2, sched2))
    assert state["timestamp"] == ts.state_dict() and state["dataloader"] == {"consumed": 48}
    assert state["config"] == {"lr": 1e-2} and state["checkpoint"]["name"] == "ep0-ba3"
    assert (random.random(), float(np.random.rand())) == draws[:2] and torch.equal(torch.rand(3), draws[2])
    resumed, _ = train_steps(model2, opt2, sched2, 3, ts)
    assert resumed == reference


def test_a_loaded_optimizer_keeps_its_own_step_kernel():
    """A state saved by an unfused Adam (a CPU run, a converted Composer checkpoint) loaded into a fused one
    (a GPU run; fused Adam runs on CPUs too): the saved lr and moments arrive, the fused kernel stays, and
    amp's scaled step, which an unfused Adam refuses, still runs."""
    saved_param, live_param = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    saved_opt = torch.optim.AdamW([saved_param], lr=0.5)
    saved_param.grad = torch.ones(3)
    saved_opt.step()
    live = torch.optim.AdamW([live_param], lr=0.1, fused=True)
    apply_state({"optimizers": [saved_opt.state_dict()]}, optimizers=[live])
    group = live.param_groups[0]
    assert (group["lr"], group["fused"], group["foreach"]) == (0.5, True, None)
    assert torch.equal(live.state[live_param]["exp_avg"], saved_opt.state[saved_param]["exp_avg"])
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale((live_param * live_param).sum()).backward()
    scaler.step(live)  # AssertionError "Expected grad_scale and found_inf to be None" with the saved fused=None
    assert live.state[live_param]["step"].item() == 2.0


def test_rng_capture_restore_and_derivation():
    state = capture_rng_state()
    first = (random.random(), np.random.rand(4).tolist(), torch.rand(4))
    restore_rng_state(state)
    assert (random.random(), np.random.rand(4).tolist()) == first[:2] and torch.equal(torch.rand(4), first[2])
    derived = [derive_rng_state(state, r) for r in (1, 2, 2)]
    draws = []
    for d in derived:
        restore_rng_state(d)
        draws.append((random.random(), float(np.random.rand()), torch.rand(1).item()))
    assert draws[1] == draws[2]  # deterministic
    assert draws[0] != draws[1] and draws[0][0] != first[0]  # independent per rank, not rank 0's


# --- async save ------------------------------------------------------------------------------------------


def test_async_save_returns_during_a_slow_upload_and_keeps_the_snapshot(memory_url):
    """The upload is held until the test lets it go: `save` must return while it is held (a save
    that waited for its upload would stall here until the hook gives up and fails the save)."""
    uploading, release = threading.Event(), threading.Event()

    def held(op: str, key: str) -> None:
        if op == "put" and key.endswith(".pt"):
            uploading.set()
            if not release.wait(60):
                raise TimeoutError("the upload was never released: save() did not return before it")

    model, opt, sched = make_training()
    _, ts = train_steps(model, opt, sched, 2, Timestamp())
    mgr = CheckpointManager(memory_url, store=HookedStore(open_store(memory_url), held))
    saved = snapshot(model, opt, sched)
    save_checkpoint(mgr, model, opt, sched, ts)
    assert uploading.wait(60) and not mgr._pending.done()  # save() returned; the upload is still going on
    with torch.no_grad():  # the loop goes on mutating parameters and optimizer state in place
        for p in model.parameters():
            p.add_(1.0)
    train_steps(model, opt, sched, 2, ts)
    release.set()
    info = mgr.wait()
    assert info.committed and info.name == "ep0-ba2"
    model2, opt2, sched2 = make_training(seed=1)
    apply_state(mgr.load(), model2, [opt2], [sched2])
    assert_same(saved, snapshot(model2, opt2, sched2))


def test_at_most_one_save_in_flight(memory_url):
    spans: dict[str, list[int]] = {}
    order = itertools.count()

    def record(op: str, key: str) -> None:
        if op == "put":
            spans.setdefault(key.split("/")[0], []).append(next(order))
            time.sleep(0.05)  # leaves room for a second save to overlap, if the manager allowed one

    model, opt, sched = make_training()
    mgr = CheckpointManager(memory_url, store=HookedStore(open_store(memory_url), record))
    ts = Timestamp()
    for _ in range(3):
        _, ts = train_steps(model, opt, sched, 1, ts)
        save_checkpoint(mgr, model, opt, sched, ts)
    mgr.wait()
    names = ["ep0-ba1", "ep0-ba2", "ep0-ba3"]
    for earlier, later in zip(names, names[1:], strict=False):
        assert max(spans[earlier]) < min(spans[later])
    assert open_store(memory_url).get("latest") == b"ep0-ba3"


def test_commit_order_is_files_then_manifest_then_pointer(memory_url):
    puts: list[str] = []
    model, opt, sched = make_training()
    mgr = CheckpointManager(memory_url, num_to_keep=1,
                            store=HookedStore(open_store(memory_url), lambda op, key: op == "put" and puts.append(key)))
    for batch in (1, 2):
        save_checkpoint(mgr, model, opt, sched, Timestamp(batch=batch))
        mgr.wait()
    second = puts[puts.index("latest") + 1:]
    assert second[-2:] == ["ep0-ba2/manifest.json", "latest"]
    assert sorted(second[:-2]) == [f"ep0-ba2/{k}" for k in ("meta.json", "model.pt", "rank0.pt",
                                                             "train_state.pt")]
    assert mgr.checkpoints() == ["ep0-ba2"]  # retention ran after the pointer moved


def test_config_must_be_json_and_fails_before_returning(memory_url):
    model, opt, sched = make_training()
    mgr = CheckpointManager(memory_url)
    with pytest.raises(TypeError, match="JSON"):
        mgr.save(capture_state(model, [opt], timestamp=Timestamp(), config={"path": Path("/x")}))
    assert mgr.wait() is None and mgr.checkpoints() == []


def test_background_error_is_raised_by_wait_and_the_next_save(memory_url):
    def fail(op: str, key: str) -> None:
        if op == "put" and key.endswith("model.pt"):
            raise OSError("disk on fire")

    model, opt, sched = make_training()
    mgr = CheckpointManager(memory_url, store=HookedStore(open_store(memory_url), fail))
    save_checkpoint(mgr, model, opt, sched, Timestamp(batch=1))
    with pytest.raises(OSError, match="disk on fire"):
        mgr.wait()
    assert mgr.wait() is None  # reported once
    save_checkpoint(mgr, model, opt, sched, Timestamp(batch=2))
    with pytest.raises(OSError, match="disk on fire"):
        save_checkpoint(mgr, model, opt, sched, Timestamp(batch=3))


# --- commit order and fallback ------------------------------------------------------------------------


def test_failure_before_the_manifest_leaves_the_previous_checkpoint(memory_url):
    def fail_second_manifest(op: str, key: str) -> None:
        if op == "put" and key == "ep0-ba2/manifest.json":
            raise ConnectionError("killed before the manifest")

    model, opt, sched = make_training()
    mgr = CheckpointManager(memory_url, store=HookedStore(open_store(memory_url), fail_second_manifest))
    _, ts = train_steps(model, opt, sched, 1, Timestamp())
    save_checkpoint(mgr, model, opt, sched, ts)
    saved = snapshot(model, opt, sched)
    mgr.wait()
    _, ts = train_steps(model, opt, sched, 1, ts)
    save_checkpoint(mgr, model, opt, sched, ts)
    with pytest.raises(ConnectionError):
        mgr.wait()
    store = open_store(memory_url)
    assert store.get("latest") == b"ep0-ba1" and store.exists("ep0-ba2/model.pt")
    with pytest.warns(CheckpointWarning, match=r"ep0-ba2.*incomplete \(no manifest.json"):
        state = CheckpointManager(memory_url).latest()
    assert state["checkpoint"]["name"] == "ep0-ba1"
    model2, opt2, sched2 = make_training(seed=1)
    apply_state(state, model2, [opt2], [sched2])
    assert_same(saved, snapshot(model2, opt2, sched2))


def _damage(store: Store, kind: str) -> str:
    """Damage the newest checkpoint (ep0-ba2) one way; return a fragment the warning must contain."""
    if kind == "flip":
        data = bytearray(store.get("ep0-ba2/model.pt"))
        data[len(data) // 2] ^= 0xFF
        store.put("ep0-ba2/model.pt", bytes(data))
        return "xxh64 mismatch"
    if kind == "truncate":
        store.put("ep0-ba2/train_state.pt", store.get("ep0-ba2/train_state.pt")[:-10])
        return "truncated"
    if kind == "delete_file":
        store.delete("ep0-ba2/rank0.pt")
        return "rank0.pt: missing"
    if kind == "no_manifest":  # the pointer names a folder without a manifest
        store.delete("ep0-ba2/manifest.json")
        return "no manifest.json"
    if kind == "bad_manifest":
        store.put("ep0-ba2/manifest.json", b"{not json")
        return "unreadable manifest"
    if kind == "missing_folder":
        for info in list(store.list("ep0-ba2/")):
            store.delete(info.key)
        return "missing from the store"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["flip", "truncate", "delete_file", "no_manifest", "bad_manifest",
                                  "missing_folder"])
def test_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path, kind):
    url = str(tmp_path / "ckpt")
    model, opt, sched = make_training()
    mgr = CheckpointManager(url, async_save=False)
    _, ts = train_steps(model, opt, sched, 1, Timestamp())
    save_checkpoint(mgr, model, opt, sched, ts)
    saved = snapshot(model, opt, sched)
    _, ts = train_steps(model, opt, sched, 1, ts)
    save_checkpoint(mgr, model, opt, sched, ts)
    assert open_store(url).get("latest") == b"ep0-ba2"
    fragment = _damage(open_store(url), kind)
    with pytest.warns(CheckpointWarning) as caught:
        state = CheckpointManager(url).latest()
    message = " ".join(str(w.message) for w in caught)
    assert "ep0-ba2" in message and fragment in message
    assert state["checkpoint"]["name"] == "ep0-ba1"
    model2, opt2, sched2 = make_training(seed=1)
    apply_state(state, model2, [opt2], [sched2])
    assert_same(saved, snapshot(model2, opt2, sched2))
    if kind == "flip":  # an explicit load of the damaged one fails instead of falling back
        with pytest.raises(CheckpointCorrupt, match="ep0-ba2"):
            CheckpointManager(url).load("ep0-ba2")


def test_no_checkpoint_and_no_usable_checkpoint(memory_url):
    mgr = CheckpointManager(memory_url)
    assert mgr.latest() is None
    with pytest.raises(CheckpointNotFound):
        mgr.load()
    model, opt, sched = make_training()
    save_checkpoint(mgr, model, opt, sched, Timestamp(batch=1))
    mgr.wait()
    mgr.store.delete("ep0-ba1/model.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        with pytest.raises(CheckpointCorrupt, match="no usable checkpoint.*model.pt: missing"):
            mgr.latest()


def test_only_partial_checkpoints_start_from_the_beginning_with_a_warning(memory_url):
    """Killed during the first save's upload: no pointer, no manifest anywhere. Nothing was ever committed,
    so autoresume starts fresh (with a warning) instead of failing on every restart."""
    mgr = CheckpointManager(memory_url)
    model, opt, sched = make_training()
    save_checkpoint(mgr, model, opt, sched, Timestamp(batch=1))
    mgr.wait()
    mgr.store.delete("ep0-ba1/manifest.json")
    mgr.store.delete("latest")
    with pytest.warns(CheckpointWarning) as caught:
        assert mgr.latest() is None
    assert "no committed checkpoint, only partial ones" in str(caught[-1].message)
    assert "ep0-ba1" in str(caught[-1].message)


def test_load_by_name_by_url_and_weights_only(tmp_path, memory_url):
    model, opt, sched = make_training()
    mgr = CheckpointManager(memory_url)
    for batch in (1, 2):
        _, ts = train_steps(model, opt, sched, 1, Timestamp(batch=batch - 1))
        save_checkpoint(mgr, model, opt, sched, ts)
    mgr.wait()
    first = mgr.load("ep0-ba1")
    assert first["checkpoint"]["name"] == "ep0-ba1"
    weights = CheckpointManager(str(tmp_path / "other")).load(memory_url + "/ep0-ba2", weights_only=True)
    assert set(weights) == {"model", "timestamp", "config", "sharded", "checkpoint"}
    assert_same(weights["model"], model.state_dict())
    newest = CheckpointManager(str(tmp_path / "other")).load(memory_url)
    assert newest["checkpoint"]["name"] == "ep0-ba2"


def test_pickled_dataloader_state_needs_allow_pickle(memory_url):
    model, opt, sched = make_training()
    mgr = CheckpointManager(memory_url)
    state = capture_state(model, [opt], [sched], timestamp=Timestamp(batch=1), dataloader=Path("/x"))
    mgr.save(state, Timestamp(batch=1))
    mgr.wait()
    with pytest.raises(Exception, match="allow_pickle=True"):
        mgr.load()
    assert CheckpointManager(memory_url, allow_pickle=True).load()["dataloader"] == Path("/x")


def test_on_saved_reports_the_committed_files(memory_url):
    seen = []
    model, opt, sched = make_training()
    mgr = CheckpointManager(memory_url, on_saved=seen.append)
    save_checkpoint(mgr, model, opt, sched, Timestamp(batch=7))
    mgr.wait()
    (info,) = seen
    manifest = json.loads(open_store(memory_url).get("ep0-ba7/manifest.json"))
    assert info.committed and info.rank == 0 and info.timestamp.batch == 7
    assert [(f.key, f.size, f.xxh64) for f in info.files] == [
        (f["key"], f["size"], f["xxh64"]) for f in manifest["files"]]
    assert info.bytes == sum(f["size"] for f in manifest["files"])


# --- retention -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("keep", "every", "expected"), [
    (2, None, [9, 10]), (3, 4, [4, 8, 9, 10]), (1, 3, [3, 6, 9, 10])])
def test_retention_keeps_the_newest_k_and_every_nth(memory_url, keep, every, expected):
    model, opt, sched = make_training()
    mgr = CheckpointManager(memory_url, num_to_keep=keep, keep_every_n=every)
    store = open_store(memory_url)
    store.put("ep0-ba0/model.pt", b"partial leftover of a crashed save")
    for batch in range(1, 11):
        save_checkpoint(mgr, model, opt, sched, Timestamp(batch=batch))
        mgr.wait()
    assert mgr.checkpoints() == [f"ep0-ba{b}" for b in reversed(expected)]
    assert store.get("latest") == b"ep0-ba10"
    assert CheckpointManager(memory_url).latest()["checkpoint"]["name"] == "ep0-ba10"


def test_retention_removes_dropped_folders_from_a_local_save_folder(tmp_path):
    """A local folder keeps empty directories where an object store has none: retention must remove
    a dropped checkpoint's directory itself, including files a listing does not show."""
    model, opt, sched = make_training()
    folder = tmp_path / "ckpt"
    mgr = CheckpointManager(folder, num_to_keep=3)
    for batch in range(1, 9):
        save_checkpoint(mgr, model, opt, sched, Timestamp(batch=batch))
        mgr.wait()
        if batch == 2:  # a leftover temporary file of an interrupted upload
            (folder / "ep0-ba2" / ".model.pt.tmp-upload").write_bytes(b"partial")
    assert sorted(p.name for p in folder.iterdir()) == ["ep0-ba6", "ep0-ba7", "ep0-ba8", "latest"]


def test_checkpoints_to_delete_keeps_the_pointer_current_and_newer_timelines():
    committed = {"model.pt": 1, "manifest.json": 1}
    folders = {"ep0-ba1": committed, "ep0-ba2": {"model.pt": 1}, "ep0-ba3": committed, "ep0-ba4": committed,
               "ep0-ba5": committed, "ep0-ba9": {"model.pt": 1}}
    assert checkpoints_to_delete(folders, "ep0-ba5", "ep0-ba1", 2, None) == ("ep0-ba3", "ep0-ba2")
    assert checkpoints_to_delete(folders, "ep0-ba5", "ep0-ba5", 1, 2) == ("ep0-ba3", "ep0-ba2", "ep0-ba1")


def test_retention_leaves_newer_folders_of_an_abandoned_timeline(memory_url):
    model, opt, sched = make_training()
    store = open_store(memory_url)
    mgr = CheckpointManager(memory_url, num_to_keep=1)
    save_checkpoint(mgr, model, opt, sched, Timestamp(batch=5))
    mgr.wait()
    store.put("ep0-ba9/model.pt", b"a newer folder from an abandoned timeline")
    save_checkpoint(mgr, model, opt, sched, Timestamp(batch=6))
    mgr.wait()
    assert mgr.checkpoints() == ["ep0-ba9", "ep0-ba6"]


def test_retention_and_fallback_in_a_bucket(s3_bucket):
    url = s3_bucket + "/runs/{run_name}/checkpoints"
    model, opt, sched = make_training()
    mgr = CheckpointManager(url, run_name="s3run", num_to_keep=2)
    ts = Timestamp()
    for _ in range(4):
        _, ts = train_steps(model, opt, sched, 1, ts)
        save_checkpoint(mgr, model, opt, sched, ts)
    mgr.wait()
    store = open_store(s3_bucket + "/runs/s3run/checkpoints")
    assert mgr.checkpoints() == ["ep0-ba4", "ep0-ba3"] and store.get("latest") == b"ep0-ba4"
    assert not any(info.key.startswith(("ep0-ba1/", "ep0-ba2/")) for info in store.list())
    _damage_newest_model(store, "ep0-ba4")
    with pytest.warns(CheckpointWarning, match="ep0-ba4.*xxh64 mismatch"):
        state = CheckpointManager(url, run_name="s3run").latest()
    assert state["checkpoint"]["name"] == "ep0-ba3"


def _damage_newest_model(store: Store, name: str) -> None:
    data = bytearray(store.get(f"{name}/model.pt"))
    data[-100] ^= 0x01
    store.put(f"{name}/model.pt", bytes(data))


# --- a real process killed mid-save ---------------------------------------------------------------------


def _killer_run(url: str, kill_at: str) -> None:
    """Save ep0-ba1 and ep0-ba2; SIGKILL this process when ep0-ba2 reaches `kill_at`."""

    def hook(op: str, key: str) -> None:
        if op == "put" and key.startswith("ep0-ba2/"):
            second.set()
        if op == "put" and key == kill_at and second.is_set():
            os.kill(os.getpid(), 9)

    second = threading.Event()

    model, opt, sched = make_training()
    mgr = CheckpointManager(url, store=HookedStore(open_store(url), hook))
    ts = Timestamp()
    for _ in range(2):
        _, ts = train_steps(model, opt, sched, 1, ts)
        save_checkpoint(mgr, model, opt, sched, ts)
        mgr.wait()
        torch.save(snapshot(model, opt, sched), Path(url).parent / f"expected-{ts.batch}.pt")


@pytest.mark.parametrize("kill_at", ["ep0-ba2/manifest.json", "latest"])
def test_kill_9_between_upload_and_commit_resumes_from_the_previous(tmp_path, kill_at):
    url = str(tmp_path / "ckpt")
    proc = subprocess.run([PYTHON, str(HERE), "killer", url, kill_at], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9, proc.stderr
    store = open_store(url)
    assert store.get("latest") == b"ep0-ba1" and store.exists("ep0-ba2/model.pt")
    expected = torch.load(tmp_path / "expected-1.pt", weights_only=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = CheckpointManager(url).latest()
    assert state["checkpoint"]["name"] == "ep0-ba1"
    if kill_at.endswith("manifest.json"):
        assert any("ep0-ba2" in str(w.message) and "incomplete" in str(w.message) for w in caught)
    model2, opt2, sched2 = make_training(seed=1)
    apply_state(state, model2, [opt2], [sched2])
    assert_same(expected, snapshot(model2, opt2, sched2))


# --- DCP: sharded save on 2 gloo ranks, load on 1, and back ----------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_ranks(world: int, *args: str) -> None:
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                   WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([PYTHON, str(HERE), *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{out}"


def _full_state(model, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, [opt], options=StateDictOptions(full_state_dict=True))
    return _clone({"model": msd, "optim": osd})


def _fsdp_worker(load_url: str, save_url: str, out: str) -> None:
    """2 ranks: load a 1-rank sharded checkpoint into FSDP2, check it, train, save sharded again."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = make_model(seed=5)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)

    loader = CheckpointManager(load_url)
    state = loader.latest(model=model, optimizers=[opt])
    assert state["sharded"] and state["checkpoint"]["rng_derived"] == (rank == 1)
    apply_state(state, model, [opt], [sched])
    loaded = _full_state(model, opt)
    if rank == 0:
        torch.save(loaded, Path(out) / "loaded_on_2.pt")

    torch.manual_seed(100)
    x = torch.randn(16, 8)
    model(x).pow(2).mean().backward()
    opt.step()
    ts = Timestamp.from_state_dict(state["timestamp"]).to_next_batch(16)
    saver = CheckpointManager(save_url, num_to_keep=2)
    saver.save(capture_state(model, [opt], [sched], timestamp=ts, dataloader={"rank": rank}), ts)
    after = _full_state(model, opt)
    info = saver.wait()
    assert info.committed == (rank == 0)
    if rank == 0:
        assert any(f.key == "dcp/__1_0.distcp" for f in info.files), info.files
        torch.save(after, Path(out) / "saved_on_2.pt")

    # A replicated (DDP-style) model: rank 0 writes the model, every rank its RNG and dataloader.
    plain = make_model(seed=7)
    plain_opt = torch.optim.AdamW(plain.parameters())
    replicated = CheckpointManager(Path(out) / "replicated")
    replicated.save(capture_state(plain, [plain_opt], timestamp=ts, dataloader={"rank": rank}), ts)
    info = replicated.wait()
    if rank == 0:
        assert {f.key for f in info.files} == {"meta.json", "model.pt", "train_state.pt", "rank0.pt",
                                               "rank1.pt"}, info.files
    dist.barrier()
    dist.destroy_process_group()


def test_dcp_sharded_save_and_load_across_world_sizes(tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    # 1 rank, a plain model saved through DCP (sharded=True).
    model, opt, sched = make_training(seed=3)
    _, ts = train_steps(model, opt, sched, 2, Timestamp())
    mgr = CheckpointManager(one, sharded=True)
    mgr.save(capture_state(model, [opt], [sched], timestamp=ts, sharded=True), ts)
    mgr.wait()
    expected = _full_state(model, opt)
    assert open_store(one).exists("ep0-ba2/dcp/.metadata")
    # 1 -> 2 ranks (FSDP2), then 2 ranks save sharded.
    _run_ranks(2, "fsdp", one, two, str(tmp_path))
    assert_same(expected, torch.load(tmp_path / "loaded_on_2.pt", weights_only=False))
    saved_on_2 = torch.load(tmp_path / "saved_on_2.pt", weights_only=False)
    # 2 -> 1 rank: as full tensors without a model, and resharded into a plain model.
    full = CheckpointManager(two).load()
    assert full["checkpoint"]["world_size"] == 2 and full["dataloader"] == {"rank": 0}
    assert_same(saved_on_2["model"], full["model"])
    model1, opt1, sched1 = make_training(seed=9)
    state = CheckpointManager(two).load(model=model1, optimizers=[opt1])
    apply_state(state, model1, [opt1], [sched1])
    assert_same(saved_on_2, _full_state(model1, opt1))
    replicated = CheckpointManager(tmp_path / "replicated").load()
    assert not replicated["sharded"] and replicated["checkpoint"]["world_size"] == 2
    assert_same(make_model(seed=7).state_dict(), replicated["model"])


# --- script entry points for the subprocess tests -------------------------------------------------------


def main(argv: list[str]) -> None:
    role, *args = argv
    if role == "killer":
        _killer_run(*args)
    elif role == "fsdp":
        _fsdp_worker(*args)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
    # no interpreter teardown after the work is done: gloo's threads can abort a finished rank
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
