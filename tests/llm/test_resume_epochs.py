"""Bitwise resume across epoch boundaries and evaluations, for the three kinds of training a user runs
with the shipped recipes: LoRA fine-tuning, full fine-tuning and pre-training.

Each kind trains with a short epoch whose last batch is partial (what broke resume before: the short
batch lowered the microbatch size for the rest of the run, so a run resumed after it cut its batches
differently) and an evaluation every few steps. One uninterrupted `tessera train` is the reference; a
second one is killed with SIGKILL right after the checkpoint of each of three points is committed
(mid-epoch; right after the first epoch boundary; right after an evaluation), and each time started
again with the same command. The final weights, optimizer and scheduler state, RNG and loader state, and
every logged loss must equal the reference's bit for bit.

Checkpoints are saved every step, so the killed process may have committed the next one before SIGKILL
lands; the test then removes the newer ones (the folder a crash right after the target's commit leaves),
so each point is resumed from exactly as named.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hf_fixtures import tiny_llama, write_chat_jsonl
from llm_helpers import write_text_corpus

TESSERA = str(Path(sys.executable).with_name("tessera"))
EVERY_STEP = ["save_interval=1ba", "save_num_checkpoints_to_keep=2", "log_interval=1ba", "loggers=[jsonl]",
              "eval_interval=4ba", "torch_threads=1"]
# 400 chat rows pack into 99 rows of 128 tokens: 13 batches of 8 per epoch, the last one of 3 rows
FINETUNE = ["max_duration=20ba", "global_train_batch_size=8", "precision=fp32", "data.eval.max_batches=2"]
# the LoRA, full fine-tuning and pre-training runs, with their kill points (mid-epoch, after the epoch
# boundary, after an evaluation; evaluations every 4 steps)
KINDS = {
    "lora": (["finetune-lora-tiny.yaml", *FINETUNE, "lora.dropout=0.1"], ["ep0-ba6", "ep1-ba13", "ep1-ba16"], 20),
    "full": (["finetune-full-llama-8b.yaml", *FINETUNE, "model.max_seq_len=128", "model.gradient_checkpointing=false",
              "optimizer.lr=1e-4"], ["ep0-ba6", "ep1-ba13", "ep1-ba16"], 20),
    # 66 windows of 32 tokens: 9 batches of 8 per epoch, the last one of 2 windows
    "pretrain": (["tiny-cpu.yaml", "model.d_model=32", "model.n_layers=1", "model.max_seq_len=32",
                  "global_train_batch_size=8", "device_train_microbatch_size=8", "max_duration=16ba",
                  "scheduler.t_warmup=2ba"], ["ep0-ba5", "ep1-ba9", "ep1-ba12"], 16),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each kind's data arguments: a tiny random Llama with 400 chat rows, or a prepared text corpus."""
    root = tmp_path_factory.mktemp("resume-inputs")
    model = tiny_llama(root / "tiny-llama")
    write_chat_jsonl(root / "chat.jsonl", 400)
    write_text_corpus(root / "corpus", 16)
    data = root / "mds"
    subprocess.run([TESSERA, "llm", "prep", str(root / "corpus"), str(data), "--tokenizer", "byte", "--seq-len",
                    "32", "--val-fraction", "0.2"], check=True, capture_output=True, timeout=120)
    chat = [f"model.pretrained={model}", f"data.train.path={root / 'chat.jsonl'}",
            f"data.eval.path={root / 'chat.jsonl'}"]
    return {"lora": chat, "full": chat,
            "pretrain": [f"data.train.streams.0.remote={data}", f"data.eval.streams.0.remote={data}"]}


def command(kind: str, inputs: dict[str, list[str]]) -> list[str]:
    args, _, _ = KINDS[kind]
    return [TESSERA, "train", args[0], *EVERY_STEP, *args[1:], *inputs[kind], "save_folder=ck"]


def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{out[-3000:]}"
    return out


def kill_after(cmd: list[str], cwd: Path, target: str) -> None:
    """Run `cmd` until the checkpoint `target` is committed, SIGKILL it, and leave the folder as a crash
    right after that commit would: `target` newest, the `latest` pointer on it."""
    proc = subprocess.Popen(cmd, cwd=cwd, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    pointer, deadline = cwd / "ck" / "latest", time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if (cwd / "ck" / target / "manifest.json").exists() and pointer.exists():
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the run ended by itself ({proc.returncode}) before {target}"
    step = int(target.rsplit("-ba", 1)[1])
    for folder in (cwd / "ck").iterdir():
        if folder.is_dir() and "-ba" in folder.name and int(folder.name.rsplit("-ba", 1)[1]) > step:
            shutil.rmtree(folder)
    pointer.write_text(target)


def logged(cwd: Path, key: str) -> dict[int, float]:
    """step -> `key` from the JSONL log; a later line for a step (the redo after a resume) wins."""
    out: dict[int, float] = {}
    for path in (cwd / "logs").glob("*/metrics.jsonl"):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # the last line of a killed run may be cut short
                continue
            if key in row:
                out[row["step"]] = row[key]
    return out


def checkpoint(cwd: Path, name: str) -> dict[str, object]:
    folder = cwd / "ck" / name
    return {f.name: torch.load(f, map_location="cpu", weights_only=False) for f in sorted(folder.glob("*.pt"))}


def flat(obj: object, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in flat(value, f"{prefix}.{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, value in enumerate(obj) for k, v in flat(value, f"{prefix}[{i}]").items()}
    return {prefix: obj}


def differing(a: dict[str, object], b: dict[str, object]) -> list[str]:
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys()
    return [k for k in fa if not (torch.equal(fa[k], fb[k]) if isinstance(fa[k], torch.Tensor) else fa[k] == fb[k])]


@pytest.mark.parametrize("kind", list(KINDS))
def test_killed_at_each_point_resumes_bitwise(kind: str, inputs, tmp_path: Path) -> None:
    _, targets, steps = KINDS[kind]
    cmd = command(kind, inputs)
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    reference = start(cmd, tmp_path / "ref")  # beside the killed runs: two cores
    try:
        run = tmp_path / "run"
        for target in targets:
            kill_after(cmd, run, target)
            saved = json.loads((run / "ck" / target / "meta.json").read_text())["timestamp"]
            epoch, batch = (int(x) for x in target[2:].split("-ba"))
            assert (saved["epoch"], saved["batch"]) == (epoch, batch)
        out = finish(start(cmd, run))
        finish(reference)
    finally:
        if reference.poll() is None:
            os.killpg(reference.pid, signal.SIGKILL)
            reference.wait()
    assert f"resumed from {run / 'ck' / targets[-1]}" in out

    ref, resumed = tmp_path / "ref", tmp_path / "run"
    name = (ref / "ck" / "latest").read_text().strip()
    assert name.endswith(f"-ba{steps}")
    assert (resumed / "ck" / "latest").read_text().strip() == name
    diff = differing(checkpoint(ref, name), checkpoint(resumed, name))  # weights, optimizer, RNG, loader
    assert not diff, f"{len(diff)} entries differ, e.g. {diff[:5]}"

    # the points are what they are named: mid-epoch, the epoch boundary (batch_in_epoch 0), an evaluation
    mid, boundary, after_eval = (int(t.rsplit("-ba", 1)[1]) for t in targets)
    evals = logged(ref, "eval/loss")
    assert after_eval in evals and mid not in evals and boundary not in evals, sorted(evals)
    if kind != "pretrain":  # fine-tuning rows: the epoch's last batch is partial (token windows wrap around)
        assert logged(ref, "time/sample")[boundary] < 8 * boundary
    assert logged(resumed, "eval/loss") == evals
    ref_loss, run_loss = logged(ref, "train/loss"), logged(resumed, "train/loss")
    assert sorted(ref_loss) == list(range(1, steps + 1))
    assert run_loss == ref_loss, [(s, run_loss.get(s), ref_loss[s]) for s in ref_loss if run_loss.get(s) != ref_loss[s]]
