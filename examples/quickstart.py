"""The Tessera quickstart (`make demo`): a language model end to end on this machine's CPU.

1. corpus: Python standard library sources (present on every machine with Python)
2. tessera llm tokenizer train   -> a byte-level BPE
3. tessera llm prep              -> MDS shards of 128-token windows in a local "bucket" folder
4. tessera train tiny-cpu.yaml   -> checkpoints into the bucket ... killed part-way (kill -9)
5. tessera train tiny-cpu.yaml   -> autoresume from the newest complete checkpoint, to the end
6. tessera llm eval / generate   -> perplexity on the held-out split, and a sample
7. a loss-curve SVG (resume point marked) and a summary of where everything is

Everything lands in demo-out/. Each step is the same CLI command a user would type (printed first).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "demo-out"
TESSERA = str(Path(sys.executable).with_name("tessera"))
PACKAGES = ["json", "email", "http", "logging", "concurrent", "importlib", "collections", "asyncio", "xml",
            "urllib", "unittest"]
RUN = "tiny-cpu"
STEPS, KILL_AFTER = 300, 120
TRAIN = [TESSERA, "train", "tiny-cpu.yaml", "tokenizer=tokenizer.json",
         "data.train.streams.0.remote=./bucket/data", "data.eval.streams.0.remote=./bucket/data",
         f"max_duration={STEPS}ba", "save_interval=40ba", "eval_interval=100ba", "log_interval=20ba",
         "save_folder=./bucket/runs/{run_name}/checkpoints"]


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
    print("$ " + " ".join(c if " " not in c else repr(c) for c in cmd).replace(TESSERA, "tessera"), flush=True)
    return subprocess.run(cmd, cwd=OUT, check=True, **kw)  # type: ignore[call-overload]


def make_corpus() -> Path:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = OUT / "corpus"
    for pkg in PACKAGES:
        for src in (stdlib / pkg).rglob("*.py"):
            dest = corpus / pkg / src.relative_to(stdlib / pkg)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
    files = list(corpus.rglob("*.py"))
    print(f"{len(files)} Python files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB from {stdlib}")
    return corpus


def latest_checkpoint() -> str | None:
    pointer = OUT / "bucket" / "runs" / RUN / "checkpoints" / "latest"
    return pointer.read_text().strip() if pointer.exists() else None


def train_and_kill() -> str:
    """Start training, wait for a checkpoint at or past KILL_AFTER, then kill -9 the whole run."""
    print("$ " + " ".join(TRAIN).replace(TESSERA, "tessera") + "   # will be killed part-way")
    proc = subprocess.Popen(TRAIN, cwd=OUT, start_new_session=True)
    try:
        while proc.poll() is None:
            name = latest_checkpoint()
            if name and int(name.rsplit("-ba", 1)[1]) >= KILL_AFTER:
                time.sleep(3.0)  # let it run on past the checkpoint: that work is lost and redone
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return name
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"training exited (code {proc.returncode}) before reaching a checkpoint at {KILL_AFTER}")


def loss_curve(svg: Path, resumed_from: int) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """Draw train and eval loss from the run's JSONL log, with the resume point marked (loss_plot.py).
    The batches between the checkpoint and the kill ran twice; the resumed run's values are kept."""
    sys.path.insert(0, str(Path(__file__).parent))
    from loss_plot import loss_svg

    train: dict[int, float] = {}
    evals: dict[int, float] = {}
    for line in (OUT / "logs" / RUN / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/loss" in row:
            train[row["step"]] = row["train/loss"]
        if "eval/loss" in row:
            evals[row["step"]] = row["eval/loss"]
    train_points, eval_points = sorted(train.items()), sorted(evals.items())
    svg.write_text(loss_svg(train_points, eval_points, steps=STEPS, resumed_from=resumed_from))
    return train_points, eval_points


def main() -> None:
    t_start = time.time()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    say("1. corpus: the Python standard library's own sources")
    corpus = make_corpus()
    say("2. train a byte-level BPE tokenizer")
    run([TESSERA, "llm", "tokenizer", "train", str(corpus), "--suffix", ".py", "--vocab-size", "4096",
         "--out", "tokenizer.json"])
    say("3. tokenize into MDS shards in a local bucket folder")
    run([TESSERA, "llm", "prep", str(corpus), "./bucket/data", "--tokenizer", "tokenizer.json", "--seq-len", "128",
         "--suffix", ".py", "--val-fraction", "0.05", "--workers", "2", "--compression", "zstd"])
    say(f"4. train (checkpoints every 40 batches); the run is killed with SIGKILL after step {KILL_AFTER}")
    killed_at = train_and_kill()
    print(f"killed -9; newest complete checkpoint in the bucket: {killed_at}")
    say("5. the same command again: autoresume from the newest complete checkpoint")
    run(TRAIN)
    ckpt = "./bucket/runs/tiny-cpu/checkpoints"
    say("6. evaluate perplexity on the held-out split, and generate")
    res = run([TESSERA, "llm", "eval", ckpt, "--data", "./bucket/data", "--split", "val", "--max-batches", "20",
               "--task", "tiny_mc", "--json"], capture_output=True, text=True)
    evals = json.loads(res.stdout)
    print(json.dumps(evals, indent=1))
    run([TESSERA, "llm", "generate", ckpt, "--prompt", "def parse(self, text):\n    ", "--max-new-tokens", "80",
         "--temperature", "0.7", "--top-k", "40", "--seed", "1"])
    say("7. loss curve and summary")
    plot = OUT / "loss.svg"
    train, _ = loss_curve(plot, int(killed_at.rsplit("-ba", 1)[1]))
    tok_s = [json.loads(line).get("throughput/tokens_per_sec") for line in
             (OUT / "logs" / RUN / "metrics.jsonl").read_text().splitlines()]
    tok_s = [t for t in tok_s if t]
    print(f"""
  data        {OUT}/bucket/data (train/ and val/ MDS shards)
  checkpoints {OUT}/bucket/runs/{RUN}/checkpoints (latest -> {latest_checkpoint()})
  logs        {OUT}/logs/{RUN}/metrics.jsonl
  loss curve  {plot} (open it in a browser)
  loss        {train[0][1]:.3f} at step {train[0][0]} -> {train[-1][1]:.3f} at step {train[-1][0]}
  killed at   after {killed_at}; resumed from it and finished {STEPS} steps
  tokens/s    {sum(tok_s) / max(len(tok_s), 1):,.0f} (mean of logged intervals)
  eval        {json.dumps(evals)}
  total time  {time.time() - t_start:.0f} s""")


if __name__ == "__main__":
    main()
