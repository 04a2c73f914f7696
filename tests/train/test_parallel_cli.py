"""`tessera train RECIPE -n 2` runs 2 processes on this machine (torchrun) with a parallelism override, saves
sharded checkpoints, and a later single-process `tessera train` resumes them (resharded) on the same loss
curve as a run that stayed on 2 processes would have continued."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.llm.prep import prep

SRC = str(Path(__file__).resolve().parents[2] / "src")
TINY = ["model.d_model=32", "model.n_layers=2", "model.max_seq_len=32", "data.train.streams.0.remote=./data",
        "data.eval.streams.0.remote=./data", "data.eval.max_batches=2", "global_train_batch_size=4",
        "save_interval=2ba", "eval_interval=4ba", "log_interval=1ba", "loggers=[jsonl]", "torch_threads=1"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    texts = root / "texts"
    texts.mkdir()
    for i in range(12):
        (texts / f"t{i}.txt").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n" for j in range(30)))
    prep(texts, root / "data", "byte", seq_len=32, val_fraction=0.2)
    return root


def tessera_train(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=SRC)
    return subprocess.run([sys.executable, "-m", "tessera.cli.main", "train", "tiny-cpu.yaml", *TINY, *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=280)


def losses(save_folder: Path) -> dict[int, float]:
    """step -> the last logged training loss of that step."""
    out = {}
    for line in (save_folder / "logs" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/loss" in row:
            out[row["step"]] = row["train/loss"]
    return out


@pytest.mark.parametrize("layout", ["parallelism.fsdp.sharding=full_shard", "parallelism.tensor_parallel.degree=2"])
def test_two_processes_then_resume_on_one(workdir: Path, layout: str) -> None:
    ckpt = workdir / layout.split(".")[1]
    first = tessera_train(workdir, "-n", "2", layout, f"save_folder={ckpt}", "max_duration=4ba")
    assert first.returncode == 0, first.stderr[-4000:]
    assert (ckpt / "latest").read_text().strip() == "ep0-ba4" and (ckpt / "ep0-ba4" / "dcp").is_dir()  # sharded
    second = tessera_train(workdir, f"save_folder={ckpt}", "max_duration=6ba")
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resumed from" in second.stderr and (ckpt / "latest").read_text().strip() == "ep0-ba6"
    got = losses(ckpt)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    reference = workdir / "reference"
    if not reference.exists():  # one process all along, for both layouts
        assert tessera_train(workdir, f"save_folder={reference}", "max_duration=6ba").returncode == 0
    expected = losses(reference)
    for step in range(1, 7):
        assert got[step] == pytest.approx(expected[step], rel=1e-4), (step, got[step], expected[step])
