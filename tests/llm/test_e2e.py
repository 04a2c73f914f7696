"""The whole flow through the CLI, as a user runs it: prep -> `tessera train` -> kill -9 -> the same
command again (autoresume) -> eval -> generate. The resumed run must match an uninterrupted one bit for
bit: every logged loss and the final model weights. Once with local folders, once with everything on S3."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from llm_helpers import write_text_corpus
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.storage import open_store

runner = CliRunner()

TESSERA = str(Path(sys.executable).with_name("tessera"))
STEPS = 30
TINY = ["model.d_model=32", "model.n_layers=1", "model.max_seq_len=32", "global_train_batch_size=4",
        "device_train_microbatch_size=4", "torch_threads=1", "scheduler.t_warmup=4ba", "optimizer.lr=1e-2",
        "save_interval=5ba", "eval_interval=20ba", "log_interval=1ba", "loggers=[jsonl]",
        "data.eval.max_batches=2",
        f"max_duration={STEPS}ba"]


def tessera(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`tessera ARGS` in a process of its own (training: as a user runs it, and killable)."""
    done = subprocess.run([TESSERA, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"tessera {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def tessera_here(*args: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The same CLI in this process (no 2.5 s of imports per command): prep, eval, generate."""
    monkeypatch.chdir(cwd)
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, f"tessera {' '.join(args)} exited {res.exit_code}:\n{res.output[-3000:]}"
    return res.stdout


def losses(cwd: Path) -> dict[int, float]:
    """step -> train loss from the JSONL log; a later line for a step (the redo after a resume) wins."""
    out: dict[int, float] = {}
    for line in (cwd / "logs" / "tiny-cpu" / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the last line of a killed run may be cut short
            continue
        if "train/loss" in row:
            out[row["step"]] = row["train/loss"]
    return out


def final_weights(save_folder: str) -> dict[str, torch.Tensor]:
    store = open_store(save_folder)
    latest = store.get("latest").decode().strip()
    assert latest == f"ep0-ba{STEPS}"
    state = torch.load(io.BytesIO(store.get(f"{latest}/model.pt")), map_location="cpu", weights_only=True)
    return state.get("model", state) if isinstance(state, dict) else state


def latest(save_folder: str) -> str | None:
    try:
        return open_store(save_folder).get("latest").decode().strip()
    except Exception:  # noqa: BLE001 - not written yet
        return None


def train_command(data: str, save_folder: str) -> list[str]:
    return ["train", "tiny-cpu.yaml", *TINY, f"data.train.streams.0.remote={data}",
            f"data.eval.streams.0.remote={data}", f"save_folder={save_folder}"]


def prep(corpus: Path, data: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tessera_here("llm", "prep", str(corpus), data, "--tokenizer", "byte", "--seq-len", "32",
                 "--val-fraction", "0.2", cwd=cwd, monkeypatch=monkeypatch)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float], dict]:
    """The corpus, and the losses and final weights of an uninterrupted run on it."""
    tmp = tmp_path_factory.mktemp("e2e")
    write_text_corpus(tmp / "corpus", 40)
    with pytest.MonkeyPatch.context() as mp:
        prep(tmp / "corpus", str(tmp / "data"), tmp, mp)
    tessera(*train_command(str(tmp / "data"), str(tmp / "ckpt")), cwd=tmp)
    loss = losses(tmp)
    assert sorted(loss) == list(range(1, STEPS + 1))
    first, last = sum(loss[s] for s in range(1, 6)) / 5, sum(loss[s] for s in range(STEPS - 4, STEPS + 1)) / 5
    assert last < first - 0.5, f"the loss did not fall: {first:.3f} -> {last:.3f}"
    return tmp / "corpus", loss, final_weights(str(tmp / "ckpt"))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_prep_train_kill_resume_eval_generate(where: str, reference, tmp_path: Path,
                                              request: pytest.FixtureRequest,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    corpus, ref_loss, ref_weights = reference
    root = request.getfixturevalue("s3_bucket") if where == "s3" else str(tmp_path / "bucket")
    data, save = f"{root}/data", f"{root}/runs/tiny-cpu/checkpoints"
    prep(corpus, data, tmp_path, monkeypatch)  # the same bytes as the reference's data: prep is deterministic

    # killed with SIGKILL after its first checkpoint, then the same command again
    proc = subprocess.Popen([TESSERA, *train_command(data, save)], cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and latest(save) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the run ended by itself ({proc.returncode}) before the kill"
    killed_at = latest(save)
    assert killed_at is not None and killed_at != f"ep0-ba{STEPS}", killed_at
    resume_step = int(killed_at.rsplit("-ba", 1)[1])
    tessera(*train_command(data, save), cwd=tmp_path)
    resumed = losses(tmp_path)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    after = [s for s in resumed if s > resume_step]
    assert after and all(resumed[s] == ref_loss[s] for s in after), \
        [(s, resumed[s], ref_loss[s]) for s in after if resumed[s] != ref_loss[s]][:5]
    assert resumed == ref_loss  # and before the kill too: the same seed gives the same run
    weights = final_weights(save)
    assert weights.keys() == ref_weights.keys()
    assert all(torch.equal(weights[k], ref_weights[k]) for k in weights)

    # eval (perplexity on the held-out split) and generate from the checkpoint folder
    out = tessera_here("llm", "eval", save, "--data", data, "--split", "val", "--max-batches", "2", "--json",
                       cwd=tmp_path, monkeypatch=monkeypatch)
    metrics = json.loads(out)
    ppl = next(v for k, v in _flat(metrics) if "perplexity" in k)
    assert 1 < ppl < 257, metrics
    out = tessera_here("llm", "generate", save, "--prompt", "def ", "--max-new-tokens", "8", "--greedy",
                       "--json", cwd=tmp_path, monkeypatch=monkeypatch)
    assert out.strip()


def _flat(obj, prefix: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}{k}/")
    elif isinstance(obj, (int, float)):
        yield prefix, float(obj)
