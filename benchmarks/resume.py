"""Autoresume time and dataloader wait, through the real `Trainer`, on local disk and SeaweedFS (S3 on
loopback).

    .venv/bin/python benchmarks/resume.py [--params-m 25] [--repeats 3] [--steps 60] [--num-workers 0] [--no-s3]

1. Autoresume: a model of `--params-m` million fp32 parameters (Linear layers of 2048 x 2048) with AdamW's
   two moments (25M -> ~300 MB of state) is trained one batch and checkpointed by the Trainer; then a new
   Trainer with `autoresume=True` is timed from `fit()` (the first thing it does is read the `latest`
   pointer) to the end of its first step (the `on_batch_end` callback), median over `--repeats` rounds
   (the targets alternate within a round; one untimed warm-up round first):

       load      pointer read, manifest check, download, hash check, torch.load, apply to the model/optimizer
       step      the rest, up to the first completed step (loader start, first batch, forward/backward/AdamW)
       total     load + step

   Each run stops after its first step (a callback raises), so `latest` never moves between repeats. The
   checkpoint files are warm in the page cache in both cases (written just before; SeaweedFS stores its
   volumes on the same disk): these are loopback figures, not a network's.

2. Dataloader wait: `StreamingDataset(shuffle=True)` + `StreamingDataLoader(batch_path=True)` feed a small
   `tessera.llm.model.GPT` (d_model 256, 4 layers, 4 heads, vocab 8192: ~5M parameters; windows of 257
   tokens, so 256 trained positions) for `--steps` batches of 8, from a local MDS folder and from
   SeaweedFS with an empty local cache. Per target:

       wait        share of the run's wall time (first batch to last) spent in `next(loader)`, all steps
       steady      the same without the first batch (its wait includes the index read and first shards)
       logged      the Trainer's own `time/data_wait_fraction` at the last step (a 20-batch window),
                   read back from its JSONL metrics file
       first       seconds waited for the first batch
       per batch   mean wait per batch after the first, milliseconds (what a faster step would see)
       step        median seconds per step

   Goal: wait < 2%.

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tessera.llm.model import GPT, GPTConfig
from tessera.shards import ShardWriter
from tessera.stream import StreamingDataLoader, StreamingDataset
from tessera.train import Callback, Trainer

WIDTH = 2048
BATCH = 8


class StopAfterFirstStep(Exception):
    """Raised by `FirstStep` to end a timed resume without the final checkpoint save."""


class FirstStep(Callback):
    def __init__(self) -> None:
        self.done_at: float | None = None

    def on_batch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        self.done_at = time.perf_counter()
        raise StopAfterFirstStep


class Wide(torch.nn.Module):
    """`--params-m` million parameters in square Linear layers; the loss is the mean square output."""

    def __init__(self, params_m: float) -> None:
        super().__init__()
        layers = max(1, round(params_m * 1e6 / (WIDTH * WIDTH)))
        self.net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.net(batch["x"]).pow(2).mean()


def state_bytes(trainer: Trainer) -> int:
    opt = trainer.optimizers[0]
    tensors = list(trainer.model.state_dict().values())
    tensors += [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
    return sum(t.numel() * t.element_size() for t in tensors)


def wide_trainer(data: str, params_m: float, save_folder: str, max_duration: str, **kw: Any) -> Trainer:
    torch.manual_seed(0)
    model = Wide(params_m)
    loader = StreamingDataLoader(StreamingDataset(local=data, batch_size=BATCH), batch_path=True)
    return Trainer(model=model, optimizers=torch.optim.AdamW(model.parameters(), lr=1e-4),
                   train_dataloader=loader, max_duration=max_duration, save_folder=save_folder,
                   run_name="resume-bench", loggers=[], **kw)


def save_first(data: str, params_m: float, url: str) -> int:
    """Train one step and let the Trainer save (and commit) its final checkpoint; the state's bytes."""
    first = wide_trainer(data, params_m, url, "1ba")
    first.fit()
    first.close()
    return state_bytes(first)


def resume_once(data: str, params_m: float, url: str) -> tuple[float, float]:
    """(seconds from fit() to the end of `_resume`, seconds from fit() to the end of the first step)."""
    callback = FirstStep()
    trainer = wide_trainer(data, params_m, url, "3ba", autoresume=True, callbacks=[callback])
    resume, marks = trainer._resume, {}

    def timed_resume() -> None:
        resume()
        marks["loaded"] = time.perf_counter()

    trainer._resume = timed_resume
    t0 = time.perf_counter()
    try:
        trainer.fit()
    except StopAfterFirstStep:
        pass
    assert trainer.timestamp.batch == 2, "did not resume from the saved step"
    trainer.close()
    return marks["loaded"] - t0, callback.done_at - t0


def measure_resume(data: str, params_m: float, targets: dict[str, str], repeats: int) -> list[dict[str, Any]]:
    """Targets interleaved in every round, after one untimed warm-up round (first-use costs in this process)."""
    sizes = {name: save_first(data, params_m, url) for name, url in targets.items()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    for round_ in range(repeats + 1):
        for name, url in targets.items():
            got = resume_once(data, params_m, url)
            if round_:
                times[name].append(got)
    med = statistics.median
    out = []
    for name, runs in times.items():
        load, total = med(r[0] for r in runs), med(r[1] for r in runs)
        out.append({"target": name, "state_bytes": sizes[name], "load_s": load, "step_s": total - load,
                    "total_s": total, "loads_s": [r[0] for r in runs], "totals_s": [r[1] for r in runs]})
    return out


# --- 2. dataloader wait ------------------------------------------------------------------------------------


def write_tokens(out: str, samples: int, seq: int, vocab: int) -> None:
    rng = np.random.default_rng(0)
    with ShardWriter(out, {"tokens": f"ndarray:uint16:{seq + 1}"}, size_limit=1 << 18) as writer:
        for _ in range(samples):
            writer.write({"tokens": rng.integers(0, vocab, seq + 1, dtype=np.uint16)})


def measure_wait(remote: str | None, local: str, steps: int, seq: int, vocab: int, num_workers: int,
                 log_dir: str) -> dict[str, float]:
    ds = StreamingDataset(remote=remote, local=local, shuffle=True, batch_size=BATCH)
    loader = StreamingDataLoader(ds, batch_path=True, num_workers=num_workers)
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=256, n_heads=4, n_layers=4, vocab_size=vocab, max_seq_len=seq))
    trainer = Trainer(model=model, optimizers=torch.optim.AdamW(model.parameters(), lr=3e-4),
                      train_dataloader=loader, max_duration=f"{steps}ba", loggers=["jsonl"], log_dir=log_dir,
                      run_name="wait-bench", grad_clip_norm=1.0)
    waits: list[float] = []
    marks: list[float] = []
    update = trainer.throughput.update

    def record(samples: int, tokens: int, data_wait: float) -> None:
        waits.append(data_wait)
        marks.append(time.perf_counter())
        update(samples, tokens, data_wait)

    trainer.throughput.update = record
    t0 = time.perf_counter()
    trainer.fit()
    trainer.close()
    lines = [json.loads(line) for line in (Path(log_dir) / "metrics.jsonl").read_text().splitlines()]
    logged = [line["time/data_wait_fraction"] for line in lines if "time/data_wait_fraction" in line]
    steps_s = np.diff([t0] + marks)
    return {"params": model.num_params(), "wait_share": sum(waits) / (marks[-1] - t0),
            "steady_wait_share": sum(waits[1:]) / (marks[-1] - marks[0]),
            "logged_wait_share": logged[-1], "first_wait_s": waits[0],
            "steady_wait_ms_per_batch": 1e3 * float(np.mean(waits[1:])), "step_s": float(np.median(steps_s))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params-m", type=float, default=25.0, help="resume model parameters, millions")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="GPT steps for the dataloader wait")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--num-workers", type=int, default=0, help="StreamingDataLoader workers (GPT part)")
    ap.add_argument("--no-s3", action="store_true", help="skip SeaweedFS")
    args = ap.parse_args()
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    vocab, server = 8192, None
    resume, wait = [], []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-resume-") as tmp:
        root = Path(tmp)
        wide_data = str(root / "wide")
        with ShardWriter(wide_data, {"x": f"ndarray:float32:{WIDTH}"}) as writer:
            for i in range(4 * BATCH):
                writer.write({"x": np.full(WIDTH, (i % 7) / 7, dtype=np.float32)})
        tokens = str(root / "tokens")
        write_tokens(tokens, samples=max(args.steps * BATCH, 512), seq=args.seq, vocab=vocab)
        targets: list[tuple[str, str, str | None]] = [("local", str(root / "ckpt"), None)]
        try:
            if not args.no_s3:
                from tests_shared import tests_module

                start_server = tests_module("s3server").start_server

                from tessera.storage import open_store

                server = start_server(buckets=("bench",))
                os.environ.update(server.env())
                src, dst = open_store(tokens), open_store("s3://bench/tokens")
                for info in src.list():
                    dst.put(info.key, src.get(info.key))
                targets.append(("s3", "s3://bench/ckpt", "s3://bench/tokens"))
            resume = measure_resume(wide_data, args.params_m, {name: url for name, url, _ in targets}, args.repeats)
            for name, _, data_remote in targets:
                local = tokens if data_remote is None else str(root / f"cache-{name}")  # cold: an empty cache
                wait.append({"target": name, **measure_wait(data_remote, local, args.steps, args.seq, vocab,
                                                            args.num_workers, str(root / f"logs-{name}"))})
        finally:
            if server is not None:
                server.stop()
    print(f"autoresume: {resume[0]['state_bytes'] / 1e6:.0f} MB of state ({args.params_m:g}M params + AdamW), "
          f"median of {args.repeats}, {os.cpu_count()} CPU(s)")
    header = f"{'target':>6} | {'load':>7} | {'1st step':>8} | {'total':>7}"
    print(header)
    print("-" * len(header))
    for r in resume:
        print(f"{r['target']:>6} | {r['load_s']:>6.2f}s | {r['step_s']:>7.2f}s | {r['total_s']:>6.2f}s")
    print(f"\ndataloader wait: GPT {wait[0]['params'] / 1e6:.1f}M params, batch {BATCH} x {args.seq} tokens, "
          f"{args.steps} steps, num_workers={args.num_workers}")
    header = (f"{'target':>6} | {'wait':>6} | {'steady':>6} | {'logged':>6} | {'first':>6} | {'per batch':>9} | "
              f"{'step':>6}")
    print(header)
    print("-" * len(header))
    for w in wait:
        print(f"{w['target']:>6} | {w['wait_share']:>6.2%} | {w['steady_wait_share']:>6.2%} | "
              f"{w['logged_wait_share']:>6.2%} | {w['first_wait_s']:>5.3f}s | "
              f"{w['steady_wait_ms_per_batch']:>6.2f} ms | {w['step_s']:>5.3f}s")
    print(json.dumps({"benchmark": "resume", "params_m": args.params_m, "repeats": args.repeats,
                      "steps": args.steps, "seq": args.seq, "num_workers": args.num_workers,
                      "autoresume": resume, "data_wait": wait}))


if __name__ == "__main__":
    main()
