"""The Trainer's fixed cost per step, against a hand-written PyTorch loop on the same model and batches.

    .venv/bin/python benchmarks/trainer_overhead.py [--steps 300] [--repeats 5] [--models scalar,gpt] [--threads 1]

Both loops run the same step: forward (the model returns the loss), backward, AdamW step, zero_grad, on
the same pre-made batches, for two models: `scalar` (8 weights: the step's own work is ~0.2 ms, so the
fixed cost stands above the noise of a shared machine) and `gpt` (a small `tessera.llm.model.GPT`, ~0.1M
parameters: the same cost next to a real step of ~15 ms). The batches come from a plain list in both
cases, so the data loader is not measured. Logging is on as in a real run, at `log_interval` 1 and 10:

    hand      the loop nanoGPT writes: `loss.item()` and one JSON line to a file at each log point
    tessera   `Trainer(..., loggers=["jsonl"], log_interval=...)` (the loss, grad-free metrics, throughput,
              step-time breakdown and memory at each log point; the same JSONL file kind)
    composer  `composer.Trainer` with the same model, optimizer and batches, if it can be imported

Per step: the median of the per-step times (host clock, one timestamp per finished step) after
`--warmup` steps; each configuration runs `--repeats` times, interleaved, and the median of those medians
is reported. Overhead = tessera (or composer) minus hand, in ms per step. CPU only here: on a GPU the same
fixed cost is host time that overlaps the device's work, so it matters when the host is the bottleneck.

Composer: `pip install mosaicml --no-deps` installs, but Composer 0.32 requires torch < 2.7.1 and
torchvision/torchmetrics built for it; with this project's torch it cannot be imported without pulling
another torch, so the composer row says why it is missing. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tessera.llm.model import GPT, GPTConfig
from tessera.train import Callback, Trainer


class ListLoader:
    """The batches as a loader: `len`, `batch_size` and iteration, nothing else."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches, self.batch_size = batches, len(batches[0]["tokens"])

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Any:
        return iter(self.batches)


class StepClock(Callback):
    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_fit_start(self, trainer: Any) -> None:
        self.marks.append(time.perf_counter())

    def on_batch_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        self.marks.append(time.perf_counter())


class Scalar(torch.nn.Module):
    """Eight weights and a mean: a step with almost no work of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(8))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return (self.w * batch["tokens"][:, :8].float()).mean()


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    if args.model == "scalar":
        return Scalar()
    return GPT(GPTConfig(d_model=args.d_model, n_heads=4, n_layers=args.layers, vocab_size=args.vocab,
                         max_seq_len=args.seq))


def make_batches(args: argparse.Namespace) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [{"tokens": torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)}
            for _ in range(args.steps)]


def step_median(marks: list[float], warmup: int) -> float:
    return statistics.median(b - a for a, b in zip(marks[warmup:], marks[warmup + 1:], strict=False))


def run_hand(args: argparse.Namespace, batches: list[dict[str, torch.Tensor]], log_interval: int, out: Path) -> float:
    model = make_model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    marks = [time.perf_counter()]
    with open(out / "hand.jsonl", "w", buffering=1) as log:
        model.train()
        for step, batch in enumerate(batches, 1):
            loss = model(batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % log_interval == 0:
                log.write(json.dumps({"step": step, "train/loss": loss.item(), "lr": opt.param_groups[0]["lr"]})
                          + "\n")
            marks.append(time.perf_counter())
    return step_median(marks, args.warmup)


def run_tessera(args: argparse.Namespace, batches: list[dict[str, torch.Tensor]], log_interval: int,
                out: Path) -> float:
    model = make_model(args)
    clock = StepClock()
    trainer = Trainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3), train_dataloader=ListLoader(batches),
                      max_duration=f"{len(batches)}ba", log_interval=f"{log_interval}ba", loggers=["jsonl"],
                      log_dir=str(out / "tessera"), callbacks=[clock], device="cpu")
    trainer.fit()
    trainer.close()
    return step_median(clock.marks, args.warmup)


def composer_runner(path: str | None) -> tuple[Any, str]:
    """(a function running Composer like the others, "") or (None, why it cannot run here)."""
    if path:
        sys.path.insert(0, path)
    try:
        import composer  # noqa: F401
        from composer import Trainer as ComposerTrainer
        from composer.models import ComposerModel
    except Exception as exc:  # ImportError, or a torch it was not built for
        return None, f"composer not importable: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"

    class Wrapped(ComposerModel):  # type: ignore[misc,valid-type]
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, batch: Any) -> Any:
            return self.inner(batch)

        def loss(self, outputs: Any, batch: Any) -> Any:
            return outputs

    class ComposerClock:  # composer's Callback protocol: batch_end
        def __init__(self) -> None:
            self.marks = [time.perf_counter()]

        def run_event(self, event: Any, state: Any, logger: Any) -> None:
            if str(event).endswith("BATCH_END"):
                self.marks.append(time.perf_counter())

    def run(args: argparse.Namespace, batches: list[dict[str, torch.Tensor]], log_interval: int, out: Path) -> float:
        model = Wrapped(make_model(args))
        clock = ComposerClock()
        trainer = ComposerTrainer(model=model, train_dataloader=ListLoader(batches),
                                  optimizers=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                  max_duration=f"{len(batches)}ba", device="cpu", callbacks=[clock],
                                  log_interval=f"{log_interval}ba", progress_bar=False, save_folder=None)
        trainer.fit()
        return step_median(clock.marks, args.warmup)

    return run, ""


def add_size_args(ap: argparse.ArgumentParser, *, steps: int, warmup: int, d_model: int, layers: int, seq: int,
                  batch: int, vocab: int) -> None:
    """The run's size options with these defaults: steps, warm-up steps, the GPT's shape, the batch and the
    torch threads (compile_ac.py takes the same)."""
    for flag, default in (("--steps", steps), ("--warmup", warmup), ("--d-model", d_model), ("--layers", layers),
                          ("--seq", seq), ("--batch", batch), ("--vocab", vocab)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, the same for every loop")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_args(ap, steps=300, warmup=20, d_model=64, layers=2, seq=64, batch=4, vocab=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--intervals", default="1,10", help="log intervals to run")
    ap.add_argument("--models", default="scalar,gpt", help="scalar, gpt or both")
    ap.add_argument("--composer-path", default=None,
                    help="a folder with composer installed (pip install --no-deps --target DIR mosaicml)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    torch.set_num_threads(args.threads)
    batches = make_batches(args)
    composer, why = composer_runner(args.composer_path)
    runners = {"hand": run_hand, "tessera": run_tessera, **({"composer": composer} if composer else {})}
    models = args.models.split(",")
    results: dict[str, dict[str, list[float]]] = {f"{m}/{i}": {name: [] for name in runners}
                                                  for m in models for i in args.intervals.split(",")}
    with tempfile.TemporaryDirectory(prefix="tessera-bench-overhead-") as tmp:
        for _ in range(args.repeats):
            for key in results:
                args.model, interval = key.split("/")
                for name, run in runners.items():
                    out = Path(tmp) / f"{name}-{args.model}-{interval}"
                    out.mkdir(exist_ok=True)
                    results[key][name].append(run(args, batches, int(interval), out))
                    torch.set_num_threads(args.threads)  # whatever a Trainer decided, the next loop gets the same
    args.model = "gpt"
    params = sum(p.numel() for p in make_model(args).parameters())
    print(f"gpt: {params / 1e6:.2f}M params (d_model {args.d_model}, {args.layers} layers); batches of {args.batch} x "
          f"{args.seq} tokens; {args.steps} steps ({args.warmup} warm-up); {args.threads} thread(s); median of "
          f"{args.repeats} interleaved runs; torch {torch.__version__}")
    if why:
        print(f"composer: not run ({why})")
    header = (f"{'model':>6} | {'log_interval':>12} | {'loop':>8} | {'ms/step':>8} | {'overhead ms':>11} | "
              f"{'runs (ms)':<40}")
    print(header)
    print("-" * len(header))
    summary: dict[str, Any] = {}
    for key, by_name in results.items():
        model, interval = key.split("/")
        hand = statistics.median(by_name["hand"])
        for name, runs in by_name.items():
            med = statistics.median(runs)
            over = med - hand
            summary[f"{model}_{name}_ms_per_step_log{interval}"] = med * 1e3
            if name != "hand":
                summary[f"{model}_{name}_overhead_ms_log{interval}"] = over * 1e3
            runs_ms = ", ".join(f"{r * 1e3:.2f}" for r in runs)
            print(f"{model:>6} | {interval:>12} | {name:>8} | {med * 1e3:>8.3f} | "
                  f"{over * 1e3 if name != 'hand' else 0:>11.3f} | {runs_ms:<40}")
    print(json.dumps({"benchmark": "trainer_overhead", "gpt_params": params, "steps": args.steps,
                      "repeats": args.repeats, "threads": args.threads, "composer": why or "ran",
                      "python": sys.version.split()[0], "torch": torch.__version__, **summary,
                      "runs_s": results}))


if __name__ == "__main__":
    main()
