"""Autoresume over damaged checkpoints, through `tessera train` as a user runs it.

- every checkpoint damaged: one `error:` line listing each checkpoint tried and why it was refused, and
  how to go on; exit 1, no traceback, nothing trained (a damaged bucket must not silently cost the run
  its progress by starting afresh);
- the newest damaged: one `warning:` line naming it and why, then the run resumes from the newest valid
  one and its next save replaces the damaged folder.
The manifest parser behind both takes any bytes: a manifest or CheckpointCorrupt, never another error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_helpers import write_text_corpus
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.train.checkpoint import (
    CheckpointCorrupt,
    CheckpointManager,
    CheckpointManifest,
    capture_state,
)
from tessera.train.time import Timestamp

runner = CliRunner()
TESSERA = str(Path(sys.executable).with_name("tessera"))
TINY = ["model.d_model=32", "model.n_layers=1", "model.max_seq_len=32", "global_train_batch_size=4",
        "device_train_microbatch_size=4", "torch_threads=1", "scheduler.t_warmup=2ba", "save_interval=5ba",
        "eval_interval=1000ba", "log_interval=1ba", "loggers=[jsonl]", "data.eval.max_batches=1"]


def train_args(folder: Path, batches: int) -> list[str]:
    return ["train", "tiny-cpu.yaml", *TINY, f"max_duration={batches}ba", f"data.train.streams.0.remote={folder / 'data'}",
            f"data.eval.streams.0.remote={folder / 'data'}", f"save_folder={folder / 'ckpt'}"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared corpus and a run that committed ep0-ba5 and ep0-ba10 (trained in this process)."""
    tmp = tmp_path_factory.mktemp("damaged")
    write_text_corpus(tmp / "corpus", 40)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)
        mp.delenv("RUN_NAME", raising=False)
        done = runner.invoke(app, ["llm", "prep", str(tmp / "corpus"), str(tmp / "data"), "--tokenizer", "byte",
                                   "--seq-len", "32", "--val-fraction", "0.2"])
        assert done.exit_code == 0, done.output
        done = runner.invoke(app, train_args(tmp, 10))
        assert done.exit_code == 0, done.output[-3000:]
    assert sorted(p.name for p in (tmp / "ckpt").glob("ep*")) == ["ep0-ba10", "ep0-ba5"]
    return tmp


@pytest.fixture
def run(saved: Path, tmp_path: Path) -> Path:
    """A copy of the saved run (data and checkpoints) to damage."""
    for name in ("data", "ckpt"):
        shutil.copytree(saved / name, tmp_path / name)
    return tmp_path


def tessera_train(folder: Path, batches: int) -> subprocess.CompletedProcess:
    """`tessera train` in a process of its own, as a user (or the platform, on a restart) runs it."""
    env = {k: v for k, v in os.environ.items() if k != "RUN_NAME"}
    return subprocess.run([TESSERA, *train_args(folder, batches)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)


def manifest_size(ckpt: Path, name: str, key: str) -> int:
    files = json.loads((ckpt / name / "manifest.json").read_text())["files"]
    return next(entry["size"] for entry in files if entry["key"] == key)


def test_every_checkpoint_damaged_is_one_error_line_listing_each(run: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = run / "ckpt"
    size = manifest_size(ckpt, "ep0-ba10", "model.pt")
    with open(ckpt / "ep0-ba10" / "model.pt", "r+b") as f:
        f.truncate(100)
    (ckpt / "ep0-ba5" / "manifest.json").write_text("garbage{")
    monkeypatch.chdir(run)
    monkeypatch.delenv("RUN_NAME", raising=False)
    done = runner.invoke(app, train_args(run, 15))  # in this process: the exit is what is tested, not a restart
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit), done.output  # no exception escaped
    assert done.stdout == ""
    assert done.stderr == (
        f"error: {ckpt}: no usable checkpoint; tried 2: ep0-ba10/model.pt: 100 bytes, but manifest.json says "
        f"{size} (truncated or overwritten); ep0-ba5/manifest.json: unreadable manifest: not JSON (Expecting "
        "value: line 1 column 1 (char 0)). Delete the damaged checkpoints (or the folder) to start afresh, or "
        "train with autoresume=false or another save_folder\n")
    assert not (run / "logs").exists()  # refused before a step was trained or logged
    assert (ckpt / "latest").read_text() == "ep0-ba10"  # nothing was touched


def test_newest_damaged_resumes_from_the_newest_valid_with_one_warning(run: Path) -> None:
    ckpt = run / "ckpt"
    rank0 = bytearray((ckpt / "ep0-ba10" / "rank0.pt").read_bytes())
    rank0[len(rank0) // 2] ^= 0xFF  # same size, other bytes: only the hash tells
    (ckpt / "ep0-ba10" / "rank0.pt").write_bytes(bytes(rank0))
    done = tessera_train(run, 10)  # the platform's restart: a process of its own, its stderr as a user sees it
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and warned[0].startswith(
        f"warning: checkpoint {ckpt}/ep0-ba10 is unusable (ep0-ba10/rank0.pt: xxh64 mismatch (expected ")
    assert warned[0].endswith("); resuming from ep0-ba5")
    assert "Traceback" not in done.stderr and f"resumed from {ckpt}/ep0-ba5 at" in done.stderr
    rows = [json.loads(line) for line in (run / "logs" / "tiny-cpu" / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if "train/loss" in row]
    assert steps == list(range(1, 11)) + list(range(6, 11))  # the saved run's log, then on from batch 5
    assert (ckpt / "latest").read_text() == "ep0-ba10"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ep0-ba10, saved again, is whole: no fallback, no warning
        assert CheckpointManager(str(ckpt)).latest()["checkpoint"]["name"] == "ep0-ba10"


def test_the_error_lists_every_checkpoint_and_no_warning_comes_before_it(tmp_path: Path) -> None:
    """Library use: the refusal is the one thing said (the per-checkpoint reasons are in it)."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    url = str(tmp_path / "ckpt")
    mgr = CheckpointManager(url, async_save=False)
    for batch in (1, 2, 3):
        mgr.save(capture_state(model, [opt], timestamp=Timestamp(batch=batch)), Timestamp(batch=batch))
    (tmp_path / "ckpt" / "ep0-ba3" / "rank0.pt").unlink()
    (tmp_path / "ckpt" / "ep0-ba2" / "manifest.json").write_text('{"files": []}')
    (tmp_path / "ckpt" / "ep0-ba1" / "manifest.json").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(CheckpointCorrupt) as caught:
            CheckpointManager(url).latest()
    assert str(caught.value) == (
        f"{url}: no usable checkpoint; tried 3: ep0-ba3/rank0.pt: missing (named in manifest.json); "
        "ep0-ba2/manifest.json: unreadable manifest: no 'timestamp' key; ep0-ba1: no manifest.json, so the save did "
        "not finish (partial checkpoint). Delete the damaged checkpoints (or the folder) to start afresh, or "
        "train with autoresume=false or another save_folder")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=4), max_leaves=12)
FIELDS = st.fixed_dictionaries({}, optional={
    "name": JSON | st.just("ep0-ba1"), "timestamp": JSON | st.just({"batch": 1}), "world_size": JSON,
    "sharded": JSON, "format": JSON | st.just("tessera.checkpoint/1"),
    "files": JSON | st.lists(st.fixed_dictionaries({}, optional={"key": JSON, "size": JSON, "xxh64": JSON}),
                             max_size=3)})


@settings(max_examples=150, deadline=None)
@given(body=st.one_of(st.binary(max_size=40), FIELDS.map(lambda d: json.dumps(d).encode()),
                      JSON.map(lambda d: json.dumps(d).encode())))
def test_any_manifest_bytes_parse_or_are_corrupt(body: bytes) -> None:
    try:
        manifest = CheckpointManifest.from_json(body, "mem://ckpt/ep0-ba1/manifest.json")
    except CheckpointCorrupt as exc:
        assert str(exc).startswith("mem://ckpt/ep0-ba1/manifest.json: ")
        return
    assert all(isinstance(count, int) for count in manifest.timestamp.values())
    assert all(isinstance(entry.size, int) for entry in manifest.files)
