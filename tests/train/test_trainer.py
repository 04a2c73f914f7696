"""The Trainer on a real (tiny) run: MDS shards streamed with shuffle=True into an MLP (trainer_run.py).

Multi-process parts run trainer_run.py as real processes: single ranks, 2 gloo ranks started directly
or through `tessera launch` (torchrun). Checkpoints of the kill -9 test live in SeaweedFS (S3).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import trainer_run as tr
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.storage import open_store
from tessera.stream import StreamingDataLoader, StreamingDataset
from tessera.train import Callback, Trainer
from tessera.train.checkpoint import CheckpointManager
from tessera.train.distributed import DistEnv, env_from_environ, first_host
from tessera.train.launch import plan_launch
from tessera.train.metrics import Throughput, peak_flops
from tessera.train.microbatch import AutoMicrobatch, SimulatedOutOfMemory, batch_size_of, split_batch

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
SCRIPT = str(Path(tr.__file__).resolve())
PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parents[2] / "src")
TESTS = str(Path(__file__).resolve().parents[1])   # trainer_run.py imports fork_server from there


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """96 samples in several shards: 12 batches of 8 per epoch."""
    path = tmp_path_factory.mktemp("data") / "mds"
    tr.write_dataset(path)
    return str(path)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [SRC, TESTS, env.get("PYTHONPATH")])), **extra)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proc:
    """A trainer_run.py process forked by the server: its pid, log and exit status file."""

    def __init__(self, pid: int, log: Path, rc: Path) -> None:
        self.pid, self.log, self.rc = pid, log, rc

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while not self.rc.exists() or not self.rc.read_text():
            if time.monotonic() > deadline:
                os.killpg(self.pid, signal.SIGKILL)
                raise AssertionError(f"pid {self.pid} did not finish in {timeout:.0f} s:\n{self.output()}")
            time.sleep(0.02)
        return int(self.rc.read_text())

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(no output)"


@pytest.fixture(scope="module")
def forker(tmp_path_factory: pytest.TempPathFactory):
    """`trainer_run.py --serve`: forks each run from one interpreter that has imported torch already
    (saves ~3 s of CPU per process on two shared cores). Yields `start(cfg, world=1) -> [Proc]`."""
    logs = tmp_path_factory.mktemp("procs")
    server = subprocess.Popen([PYTHON, SCRIPT, "--serve"], env=_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, start_new_session=True)
    count = iter(range(10**6))

    def start(cfg: dict[str, Any], world: int = 1) -> list[Proc]:
        port = str(_free_port())
        procs = []
        for rank in range(world):
            n = next(count)
            env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
            cmd = {"cfg": cfg, "env": env, "log": str(logs / f"{n}.log"), "rc": str(logs / f"{n}.rc")}
            server.stdin.write((json.dumps(cmd) + "\n").encode())
            server.stdin.flush()
            line = server.stdout.readline()
            assert line, "the fork server died"
            procs.append(Proc(int(line), logs / f"{n}.log", logs / f"{n}.rc"))
        return procs

    yield start
    server.stdin.close()
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def finish(procs: list[Proc], returncode: int = 0, timeout: float = 120.0) -> None:
    for proc in procs:
        code = proc.wait(timeout)
        assert code == returncode, f"exit {code}, expected {returncode}:\n{proc.output()}"


def global_steps(out: str | Path, world: int) -> dict[int, dict[str, Any]]:
    """step -> {"loss", "ids" (sorted, over all ranks), "microbatch" per rank, "pid" of rank 0}, for the steps
    every rank logged."""
    ranks = [tr.read_steps(out, r) for r in range(world)]
    return {step: {"loss": line["loss"], "pid": line["pid"],
                   "ids": sorted(i for r in ranks for i in r[step]["ids"]),
                   "microbatch": [r[step]["microbatch"] for r in ranks]}
            for step, line in ranks[0].items() if all(step in r for r in ranks)}


def assert_same_weights(a: Path, b: Path, exact: bool = True) -> None:
    wa, wb = torch.load(a), torch.load(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        if exact:
            assert torch.equal(wa[key], wb[key]), key
        else:
            torch.testing.assert_close(wa[key], wb[key], rtol=1e-4, atol=1e-5, msg=key)


def assert_bitwise_same_run(a_out: Path, b_out: Path, steps: int) -> dict[int, dict[str, Any]]:
    """Runs A (uninterrupted) and B (killed and resumed) trained the same batches with the same losses
    at every step and ended with the same weights, bit for bit; returns B's steps."""
    a, b = global_steps(a_out, 1), global_steps(b_out, 1)
    assert sorted(a) == sorted(b) == list(range(1, steps + 1))
    for step in a:
        assert a[step]["ids"] == b[step]["ids"], step
        assert a[step]["loss"] == b[step]["loss"], (step, a[step]["loss"], b[step]["loss"])
    assert_same_weights(a_out / "final.pt", b_out / "final.pt")
    return b


# --- 1. kill -9 and autoresume: bitwise identical, checkpoints in S3 -----------------------------------------


def test_kill_9_then_autoresume_is_bitwise_identical(tmp_path, dataset, s3_bucket, forker):
    base = {"data": dataset, "max_duration": "20ba", "save_interval": "3ba"}
    reference = forker({**base, "out": str(tmp_path / "a")})  # uninterrupted, alongside the killed run
    run = {**base, "out": str(tmp_path / "b"), "save_folder": f"{s3_bucket}/runs/{{run_name}}/checkpoints",
           "loggers": ["jsonl"]}
    # Killed right after step 7 (the save of step 6 may still be uploading), then after step 13 once the
    # epoch-end checkpoint of step 12 is committed, then run to the end.
    finish(forker({**run, "kill_at": 7}), returncode=-9)
    finish(forker({**run, "autoresume": True, "kill_at": 13, "kill_after_commit": True}), returncode=-9)
    finish(forker({**run, "autoresume": True}))
    finish(reference)

    b = assert_bitwise_same_run(tmp_path / "a", tmp_path / "b", steps=20)
    # Three processes trained B: the third one resumed from the epoch-end checkpoint ep1-ba12.
    pids = [b[step]["pid"] for step in range(1, 21)]
    assert len(set(pids)) == 3 and pids[12] != pids[11] and len(set(pids[12:])) == 1
    assert pids[6] != pids[5] or pids[3] != pids[2]  # the second process resumed from step 3 or 6
    store = open_store(f"{s3_bucket}/runs/tiny/checkpoints")
    assert store.get("latest") == b"ep1-ba20"
    logged = [json.loads(line)["step"] for line in store.get("logs/metrics.jsonl").decode().splitlines()]
    assert logged[-1] == 20 and set(logged) == set(range(1, 21))


def test_kill_9_inside_a_save_then_autoresume_is_bitwise_identical(tmp_path, dataset, s3_bucket, forker):
    """Killed on the save thread itself: mid-upload of the first save (nothing committed: a fresh start),
    mid-upload of a later one (files of ep0-ba6 in the bucket, no manifest), and between the manifest of
    ep1-ba12 and the `latest` pointer. Each time autoresume continues from the pointer's checkpoint with
    a warning, and the run ends bitwise identical to an uninterrupted one."""
    base = {"data": dataset, "max_duration": "20ba", "save_interval": "3ba"}
    reference = forker({**base, "out": str(tmp_path / "a")})
    run = {**base, "out": str(tmp_path / "b"), "save_folder": f"{s3_bucket}/runs/{{run_name}}/checkpoints",
           "loggers": ["jsonl"]}
    store = open_store(f"{s3_bucket}/runs/tiny/checkpoints")

    finish(forker({**run, "kill_in_save": {"name": "ep0-ba3", "when": "upload"}}), returncode=-9)
    partial = {info.key for info in store.list("ep0-ba3/")}
    assert partial and "ep0-ba3/manifest.json" not in partial and not store.exists("latest")

    second = forker({**run, "autoresume": True, "kill_in_save": {"name": "ep0-ba6", "when": "upload"}})
    finish(second, returncode=-9)
    assert "no committed checkpoint, only partial ones" in second[0].output()  # a warning, then step 1
    assert store.get("latest") == b"ep0-ba3"
    partial = {info.key for info in store.list("ep0-ba6/")}
    assert partial and "ep0-ba6/manifest.json" not in partial  # died mid-upload, before the commit

    third = forker({**run, "autoresume": True, "kill_in_save": {"name": "ep1-ba12", "when": "pointer"}})
    finish(third, returncode=-9)
    assert "ep0-ba6 is newer than latest but incomplete" in third[0].output()
    assert "Traceback" not in second[0].output() + third[0].output()
    assert store.get("latest") == b"ep0-ba9" and store.exists("ep1-ba12/manifest.json")

    last = forker({**run, "autoresume": True})  # resumes from the pointer (ep0-ba9), not ep1-ba12
    finish(last)
    finish(reference)
    b = assert_bitwise_same_run(tmp_path / "a", tmp_path / "b", steps=20)
    # The last process to train each step: the second (fresh start) for 1-3, the third for 4-9, the last.
    pids = [b[step]["pid"] for step in range(1, 21)]
    assert pids == [second[0].pid] * 3 + [third[0].pid] * 6 + [last[0].pid] * 11
    assert store.get("latest") == b"ep1-ba20"


# --- 2 and 4. two ranks: elastic resume on one rank, auto-microbatching agreed between ranks -------------


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, dataset, forker) -> dict[str, Any]:
    """Reference: 2 ranks, 8 batches. Elastic part: 2 ranks for 4 batches with checkpoints,
    auto-microbatching, and rank 1 out of memory above 2 samples per microbatch."""
    root = tmp_path_factory.mktemp("two")
    base = {"data": dataset, "dropout": 0.0, "global_batch_size": 8}
    reference = forker({**base, "out": str(root / "ref"), "max_duration": "8ba"}, world=2)
    elastic = {**base, "out": str(root / "elastic"), "save_folder": str(root / "ckpt"), "save_interval": "2ba"}
    first = forker({**elastic, "max_duration": "4ba", "microbatch": "auto", "oom_above": 2, "oom_ranks": [1]},
                  world=2)
    sharded = {**base, "out": str(root / "fsdp"), "save_folder": str(root / "fsdp-ckpt"), "parallelism": "fsdp"}
    fsdp = forker({**sharded, "max_duration": "4ba", "save_interval": "4ba"}, world=2)
    finish(reference)
    finish(first)
    finish(fsdp)
    return {"root": root, "base": base, "elastic": elastic, "sharded": sharded, "forker": forker}


def test_elastic_resume_on_another_world_size_continues_the_global_order(two_ranks):
    """2 ranks (steps 1-4) -> 1 rank (5-6) -> 4 ranks (7-8), global batch 8 throughout: the same global
    batches and losses as the uninterrupted 2-rank run. Ranks 2 and 3 did not exist at any save."""
    root = two_ranks["root"]
    finish(two_ranks["forker"]({**two_ranks["elastic"], "max_duration": "6ba", "autoresume": True}, world=1))
    finish(two_ranks["forker"]({**two_ranks["elastic"], "max_duration": "8ba", "autoresume": True}, world=4))
    ref = global_steps(root / "ref", 2)
    two = global_steps(root / "elastic", 2)  # steps 1-4 on 2 ranks (rank 1 logged 1-4 and 7-8)
    one = global_steps(root / "elastic", 1)  # steps 5-6 on 1 rank (rank 0's file has all 8)
    four = global_steps(root / "elastic", 4)  # steps 7-8 on 4 ranks
    assert sorted(ref) == sorted(one) == list(range(1, 9)) and sorted(four) == [7, 8]
    for step in range(1, 9):
        got = two[step] if step <= 4 else one[step] if step <= 6 else four[step]
        assert got["ids"] == ref[step]["ids"], f"step {step}: another global batch"
        assert math.isclose(got["loss"], ref[step]["loss"], rel_tol=1e-5), (step, got["loss"], ref[step]["loss"])
    pids = [one[s]["pid"] for s in range(1, 9)]
    assert len(set(pids[:4])) == len(set(pids[4:6])) == len(set(pids[6:])) == 1 and len(set(pids)) == 3
    assert [len(tr.read_steps(root / "elastic", r)[8]["ids"]) for r in range(4)] == [2, 2, 2, 2]
    assert_same_weights(root / "ref" / "final.pt", root / "elastic" / "final.pt", exact=False)


def test_fsdp_sharded_checkpoint_resumes_on_one_rank(two_ranks):
    """FSDP2 on 2 gloo ranks (DCP-sharded checkpoint), resumed by a single process: the same curve."""
    root = two_ranks["root"]
    assert open_store(root / "fsdp-ckpt").exists("ep0-ba4/dcp/.metadata")
    finish(two_ranks["forker"]({**two_ranks["sharded"], "max_duration": "8ba", "autoresume": True}))
    ref, fsdp, one = global_steps(root / "ref", 2), global_steps(root / "fsdp", 2), global_steps(root / "fsdp", 1)
    for step in range(1, 9):
        got = fsdp[step] if step <= 4 else one[step]
        assert got["ids"] == ref[step]["ids"], step
        assert math.isclose(got["loss"], ref[step]["loss"], rel_tol=1e-5), (step, got["loss"], ref[step]["loss"])
    assert_same_weights(root / "ref" / "final.pt", root / "fsdp" / "final.pt", exact=False)


def test_auto_microbatch_halves_on_every_rank_when_one_runs_out_of_memory(two_ranks):
    root = two_ranks["root"]
    ref, two = global_steps(root / "ref", 2), global_steps(root / "elastic", 2)
    for step in range(1, 5):
        assert two[step]["microbatch"] == [2, 2], step  # 4 -> 2 on both ranks; only rank 1 ran out
        assert math.isclose(two[step]["loss"], ref[step]["loss"], rel_tol=1e-5)


# --- in-process runs (one rank) ---------------------------------------------------------------------------------


def test_gradient_accumulation_matches_the_full_batch(tmp_path, dataset):
    base = {"data": dataset, "max_duration": "4ba", "dropout": 0.0}
    tr.run({**base, "out": str(tmp_path / "full")})
    tr.run({**base, "out": str(tmp_path / "micro"), "microbatch": 2})
    full, micro = tr.read_steps(tmp_path / "full"), tr.read_steps(tmp_path / "micro")
    assert [micro[s]["microbatch"] for s in micro] == [2] * 4 and full[1]["microbatch"] == 8
    for step in full:
        assert math.isclose(full[step]["loss"], micro[step]["loss"], rel_tol=1e-6)
    assert_same_weights(tmp_path / "full" / "final.pt", tmp_path / "micro" / "final.pt", exact=False)


def test_auto_microbatch_after_out_of_memory_gives_the_same_run(tmp_path, dataset):
    """8 and 4 samples 'do not fit': the batch is rerun with 2, from the same RNG state (dropout on)."""
    base = {"data": dataset, "max_duration": "3ba"}
    tr.run({**base, "out": str(tmp_path / "fixed"), "microbatch": 2})
    trainer = tr.run({**base, "out": str(tmp_path / "auto"), "microbatch": "auto", "oom_above": 3})
    assert trainer.microbatch.size == 2 and trainer.microbatch.retries == 2
    fixed, auto = tr.read_steps(tmp_path / "fixed"), tr.read_steps(tmp_path / "auto")
    assert [fixed[s]["loss"] for s in fixed] == [auto[s]["loss"] for s in auto]
    assert_same_weights(tmp_path / "fixed" / "final.pt", tmp_path / "auto" / "final.pt")


@pytest.mark.parametrize("precision", ["amp_bf16", "amp_fp16"])
def test_autocast_precisions(tmp_path, dataset, precision):
    base = {"data": dataset, "max_duration": "3ba", "dropout": 0.0}
    tr.run({**base, "out": str(tmp_path / "fp32")})
    trainer = tr.run({**base, "out": str(tmp_path / precision), "precision": precision,
                      "save_folder": str(tmp_path / "ckpt"), "save_interval": "3ba"})
    fp32, amp = tr.read_steps(tmp_path / "fp32"), tr.read_steps(tmp_path / precision)
    for step in fp32:
        assert fp32[step]["loss"] != amp[step]["loss"]  # autocast really ran in lower precision
        assert math.isclose(fp32[step]["loss"], amp[step]["loss"], rel_tol=3e-2)
    assert trainer.scaler.is_enabled() == (precision == "amp_fp16")
    saved = CheckpointManager(tmp_path / "ckpt").load()
    assert (saved["scaler"] is not None) == (precision == "amp_fp16")


def test_load_path_full_state_or_weights_only(tmp_path, dataset):
    source = tmp_path / "ckpt"
    first = tr.run({"data": dataset, "out": str(tmp_path / "a"), "max_duration": "3ba", "save_folder": str(source)})
    weights = torch.load(tmp_path / "a" / "final.pt")
    for weights_only, batch in ((True, 0), (False, 3)):
        trainer, _ = tr.build({"data": dataset, "out": str(tmp_path / f"b{weights_only}"), "max_duration": "3ba"})
        trainer.load_path, trainer.load_weights_only = str(source / "ep0-ba3"), weights_only
        trainer._resume()
        assert trainer.timestamp.batch == batch
        for key, value in trainer.model.state_dict().items():
            assert torch.equal(value, weights[key]), key
        assert bool(trainer.optimizers[0].state) != weights_only  # AdamW moments only with the full state
    assert first.timestamp.batch == 3


def test_a_callback_can_stop_the_run(tmp_path, dataset):
    class StopAt3(Callback):
        def on_batch_end(self, trainer, metrics):
            trainer.stop_requested = trainer.timestamp.batch == 3

    trainer, _ = tr.build({"data": dataset, "out": str(tmp_path), "max_duration": "10ba",
                           "save_folder": str(tmp_path / "ckpt")})
    trainer.callbacks.append(StopAt3())
    trainer.fit()
    trainer.close()
    assert trainer.timestamp.batch == 3 and open_store(tmp_path / "ckpt").get("latest") == b"ep0-ba3"


def test_a_microbatch_of_one_that_does_not_fit_is_a_clear_error():
    micro = AutoMicrobatch(1, auto=True, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="microbatch of 1 sample"):
        micro.agree(True)


def test_eval_runs_at_its_interval_and_reports_metrics(tmp_path, dataset):
    trainer, recorder = tr.build({"data": dataset, "out": str(tmp_path), "max_duration": "5ba",
                                  "eval_interval": "2ba", "loggers": ["jsonl"]})
    trainer.fit()
    assert [e["step"] for e in recorder.evals] == [2, 4, 5]  # the interval, then once at the end
    for e in recorder.evals:
        assert 0 < e["eval/loss"] < 10 and 0 <= e["eval/accuracy"] <= 1
    lines = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "eval/loss" in line] == [2, 4, 5]
    assert all("train/loss" in line for line in lines if "eval/loss" not in line and "summary/time/train_sec" not in line)
    assert "summary/throughput/samples_per_sec" in lines[-2]  # the run's summary, before the final eval


@pytest.mark.parametrize("duration, expected", [
    ("2ep", {"epoch": 2, "batch": 24, "sample": 192}),
    ("5ba", {"epoch": 0, "batch": 5, "sample": 40}),
    ("44sp", {"batch": 6, "sample": 48}),          # stops on the batch that reaches 44 samples
    ("200tok", {"batch": 4, "token": 256}),        # 64 tokens per batch (num_tokens_fn)
])
def test_max_duration_in_every_unit(tmp_path, dataset, duration, expected):
    cfg = {"data": dataset, "out": str(tmp_path), "max_duration": duration, "dropout": 0.0}
    if duration == "2ep":
        cfg.update(save_folder=str(tmp_path / "ckpt"), save_interval="1ep")
    trainer = tr.run(cfg)
    got = trainer.timestamp.state_dict()
    assert {k: got[k] for k in expected} == expected
    if duration == "2ep":
        assert sorted(open_store(tmp_path / "ckpt").get("latest").decode().split()) == ["ep2-ba24"]
        assert {c for c in trainer.checkpoints.checkpoints()} == {"ep1-ba12", "ep2-ba24"}


def test_retention_leaves_only_the_kept_checkpoints_in_a_local_save_folder(tmp_path, dataset):
    save = tmp_path / "ckpt"
    tr.run({"data": dataset, "out": str(tmp_path), "max_duration": "7ba", "save_folder": str(save),
            "save_interval": "1ba", "keep": 3})
    assert sorted(p.name for p in save.iterdir()) == ["ep0-ba5", "ep0-ba6", "ep0-ba7", "latest"]


def _good(dataset: str, tmp_path: Path) -> dict[str, Any]:
    return {"data": dataset, "out": str(tmp_path), "max_duration": "2ba"}


@pytest.mark.parametrize("change, message", [
    ({"precision": "fp8"}, "unknown precision 'fp8'; use one of"),
    ({"max_duration": "10bx"}, "max_duration: cannot parse time '10bx'"),
    ({"max_duration": "0.5dur"}, "max_duration must be in ba, ep, sp or tok"),
    ({"save_interval": "5 batches", "save_folder": "x"}, "save_interval: cannot parse time"),
    ({"eval_interval": "1xx"}, "eval_interval: cannot parse"),
    ({"microbatch": "big"}, "device_train_microbatch_size must be a positive int, 'auto' or None"),
    ({"autoresume": True}, "autoresume=True needs save_folder"),
    ({"parallelism": "tp"}, "unknown parallelism 'tp'"),
])
def test_bad_configuration_fails_before_training(tmp_path, dataset, change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tr.build({**_good(dataset, tmp_path), **change})
    assert not (tmp_path / "rank0.jsonl").exists()


def _trainer(dataset: str, loader_batch: int, global_batch_size: int) -> Trainer:
    model = tr.MLP()
    loader = StreamingDataLoader(StreamingDataset(local=dataset, batch_size=loader_batch))
    return Trainer(model=model, optimizers=torch.optim.SGD(model.parameters(), lr=0.1), train_dataloader=loader,
                   max_duration="2ba", global_batch_size=global_batch_size, loggers=[])


def test_global_batch_must_match_the_loader_and_the_world_size(monkeypatch, dataset):
    with pytest.raises(ValueError, match="needs a per-device batch of 16, but train_dataloader yields 8; set its "
                                         "batch_size to 16"):
        _trainer(dataset, loader_batch=8, global_batch_size=16)
    monkeypatch.setenv("WORLD_SIZE", "3")  # checked before any process group is created
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="global_batch_size=8 is not divisible by the world size 3; use a multiple"):
        _trainer(dataset, loader_batch=8, global_batch_size=8)


def test_unwritable_save_folder_fails_before_training(tmp_path, dataset, s3_bucket):
    (tmp_path / "file").write_text("not a folder")
    for folder in (str(tmp_path / "file" / "ckpt"), "s3://no-such-bucket-tessera/ckpt"):
        with pytest.raises(ValueError, match="cannot be written .*check the bucket name"):
            tr.build({**_good(dataset, tmp_path), "save_folder": folder})


def test_tensorboard_without_the_package_says_how_to_install_it(tmp_path, dataset):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install tensorboard"):
            tr.build({**_good(dataset, tmp_path), "loggers": ["tensorboard"]})
    else:
        pytest.skip("tensorboard is installed")


# --- heartbeat, launcher, pieces ------------------------------------------------------------------------------


def test_heartbeat_file_and_checkpoint_events(tmp_path, dataset, monkeypatch):
    beat = tmp_path / "hb" / "heartbeat.json"
    monkeypatch.setenv("TESSERA_HEARTBEAT", str(beat))
    monkeypatch.setenv("TESSERA_HEARTBEAT_INTERVAL", "0")
    tr.run({**_good(dataset, tmp_path), "max_duration": "4ba", "save_folder": str(tmp_path / "ckpt"),
            "save_interval": "2ba"})
    body = json.loads(beat.read_text())
    assert body["status"] == "finished" and body["step"] == 4 and body["run_name"] == "tiny"
    assert body["last_checkpoint"]["name"] == "ep0-ba4"
    events = [json.loads(line) for line in Path(str(beat) + ".events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["fit_start", "checkpoint", "checkpoint", "fit_end"]
    assert [e["name"] for e in events if e["kind"] == "checkpoint"] == ["ep0-ba2", "ep0-ba4"]


def test_heartbeat_to_a_url_posts_json_without_blocking():
    import http.server
    import threading

    from tessera.train.heartbeat import Heartbeat
    from tessera.train.time import Timestamp

    received: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        beat = Heartbeat(f"http://127.0.0.1:{server.server_port}/beat", interval=0, run_name="r")
        beat.beat(Timestamp(batch=3))
        beat.event("checkpoint", name="ep0-ba3", url="s3://b/ep0-ba3", step=3)
        beat.close()
    finally:
        server.shutdown()
    assert [r["kind"] for r in received][-1] == "checkpoint" and received[-1]["name"] == "ep0-ba3"
    assert any(r["kind"] == "heartbeat" and r["step"] == 3 for r in received) or len(received) == 1
    unreachable = Heartbeat("http://127.0.0.1:9/none", interval=0)  # a dead endpoint never raises
    unreachable.beat(Timestamp())
    unreachable.close(timeout=15)


def test_launch_runs_n_ranks_through_torchrun(tmp_path):
    """Both ranks get torchrun's variables and the script's arguments; a failing rank's exit code is
    the launcher's (rank 1 exits with 3 once rank 0 has written its file)."""
    script = tmp_path / "show_rank.py"
    script.write_text(
        "import os, sys, time\n"
        "out, rank = sys.argv[1], os.environ['RANK']\n"
        "open(os.path.join(out, 'rank' + rank), 'w').write(os.environ['WORLD_SIZE'] + ' ' + sys.argv[2])\n"
        "while rank == '1' and not os.path.exists(os.path.join(out, 'rank0')):\n"
        "    time.sleep(0.05)\n"
        "sys.exit(3 if rank == '1' else 0)\n")
    proc = subprocess.run([PYTHON, "-m", "tessera.cli.main", "launch", "-n", "2", str(script), str(tmp_path),
                           "--flag"], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert (tmp_path / "rank0").read_text() == "2 --flag" and (tmp_path / "rank1").read_text() == "2 --flag"


def test_launch_maps_slurm_variables_to_torchrun():
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_GPUS_ON_NODE": "4"}
    plan = plan_launch(env=env)
    assert plan.torchrun_args("train.py", ["--lr", "1"]) == [
        "--nproc-per-node=4", "--nnodes=2", "--node-rank=1", "--master-addr=gpu07", "--master-port=24242",
        "train.py", "--lr", "1"]
    assert plan_launch(3, env={}).torchrun_args("t.py", []) == ["--nproc-per-node=3", "--standalone", "t.py"]
    result = CliRunner().invoke(app, ["launch", "--dry-run", "-n", "2", "train.py", "-n", "5", "--x"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("torch.distributed.run --nproc-per-node=2 --standalone train.py -n 5 --x")


def test_ranks_from_slurm_inside_an_srun_step_only(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                        "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[07-08]"}.items():
        monkeypatch.setenv(name, value)
    assert env_from_environ() == DistEnv(0, 1, 0, 1)  # a shell in the allocation is one process
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert env_from_environ() == DistEnv(3, 8, 1, 4, "gpu07", 24242)
    monkeypatch.setenv("RANK", "5")  # torchrun's variables win (tessera launch under srun)
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert env_from_environ().rank == 5 and env_from_environ().world_size == 16


@pytest.mark.parametrize("nodelist, host", [("node01", "node01"), ("gpu[07-09,12],cpu3", "gpu07"),
                                            ("r[1-2]-n[3-4]", "r1-n3"), ("a,b", "a")])
def test_first_host_of_a_slurm_nodelist(nodelist, host):
    assert first_host(nodelist) == host


def test_split_batch_keeps_columns_together():
    batch = {"x": torch.arange(10).reshape(5, 2), "y": torch.arange(5), "names": list("abcde"), "tag": "t"}
    parts = split_batch(batch, 2)
    assert [batch_size_of(p) for p in parts] == [2, 2, 1]
    assert parts[2]["names"] == ["e"] and parts[2]["tag"] == "t" and parts[1]["x"].tolist() == [[4, 5], [6, 7]]
    pair = (torch.zeros(2, 3), torch.ones(2))  # a tuple of columns, even with 2 samples
    assert [batch_size_of(p) for p in split_batch(pair, 1)] == [1, 1]
    with pytest.raises(SimulatedOutOfMemory):
        tr.MLP(oom_above=1)({"x": torch.zeros(2, 8), "y": torch.zeros(2, dtype=torch.long), "id": torch.arange(2)})


def test_throughput_and_mfu():
    meter = Throughput(window=4)
    meter.start()
    for i in range(1, 4):
        meter.update(samples=8 * i, tokens=64 * i, data_wait=0.0)
    metrics = meter.metrics(world_size=2, model_flops_per_token=1e6, device_peak_flops=1e9)
    assert metrics["throughput/samples_per_sec"] > 0 and metrics["throughput/tokens_per_sec"] > 0
    assert math.isclose(metrics["throughput/mfu"], metrics["throughput/tokens_per_sec"] * 1e6 / 2e9)
    assert "throughput/mfu" not in meter.metrics(world_size=1, model_flops_per_token=1e6)
    assert peak_flops(torch.device("cpu"), "amp_bf16") is None
