"""The real trainer for the platform tests: `tessera train tiny-cpu.yaml` shrunk to a 1-layer d_model=32
model (150 batches in a few seconds), and how to compare a run with the uninterrupted reference run (the
`reference` fixture in conftest.py): same losses, bitwise the same final weights."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from platform_helpers import wait_for

TESSERA = str(Path(sys.executable).with_name("tessera"))
STEPS = 150  # long enough that a move requested after the first checkpoint lands mid-run
TIMEOUT = 90
TINY = ("model.d_model=32 model.n_layers=1 model.max_seq_len=32 global_train_batch_size=4 "
        "device_train_microbatch_size=2 torch_threads=1 "
        "scheduler.t_warmup=4ba optimizer.lr=1e-2 save_interval=10ba eval_interval=1000ba log_interval=1ba "
        f"loggers=[jsonl] data.eval.max_batches=1 max_duration={STEPS}ba")


def write_corpus(root: Path, n_docs: int = 40) -> None:
    rng = random.Random(0)
    words = "def class return import from yield with open read write data model token value index".split()
    root.mkdir(parents=True)
    for i in range(n_docs):
        text = "\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(rng.randint(1, 10)))
        (root / f"doc{i:03d}.txt").write_text(text + "\n")


def train_command(data: Path, folder: Path, *extra: str) -> str:
    """`tessera train` working in FOLDER (logs/ there, checkpoints in FOLDER/ckpt)."""
    return (f"cd {folder} && {TESSERA} train tiny-cpu.yaml {TINY} data.train.streams.0.remote={data} "
            f"data.eval.streams.0.remote={data} save_folder={folder}/ckpt " + " ".join(extra))


def losses(folder: Path) -> dict[int, float]:
    """step -> train loss (a later line for a step, written after a resume, wins), from the one run logged in
    FOLDER (logs/<run name>/: tiny-cpu outside the platform, the platform run's name in it)."""
    out: dict[int, float] = {}
    [metrics] = (folder / "logs").glob("*/metrics.jsonl")
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "train/loss" in row:
            out[row["step"]] = row["train/loss"]
    return out


def final_weights(folder: Path) -> dict:
    import torch

    final = (folder / "ckpt" / "latest").read_text().strip()
    assert final.endswith(f"-ba{STEPS}"), final
    state = torch.load(folder / "ckpt" / final / "model.pt", map_location="cpu", weights_only=True)
    return state.get("model", state)


def assert_same_run(folder: Path, reference: tuple[dict, dict]) -> None:
    import torch

    ref_loss, ref_weights = reference
    got = losses(folder)
    assert got == ref_loss, [(s, got.get(s), ref_loss[s]) for s in ref_loss if got.get(s) != ref_loss[s]][:5]
    weights = final_weights(folder)
    assert weights.keys() == ref_weights.keys()
    assert all(torch.equal(weights[k], ref_weights[k]) for k in weights)


def spec(name: str, command: str, cluster: str = "local", nodes: int = 1, **scheduling) -> dict:
    return {"name": name, "command": command, "compute": {"cluster": cluster, "nodes": nodes},
            "scheduling": {"max_retries": 2, "stop_grace": "20s", **scheduling}}


def first_checkpoint(folder: Path) -> str:
    pointer = folder / "ckpt" / "latest"
    return wait_for(lambda: pointer.exists() and pointer.read_text(), timeout=TIMEOUT,
                    what="a first checkpoint")
