"""Step time and peak memory with activation checkpointing and torch.compile, each on and off.

    .venv/bin/python benchmarks/compile_ac.py [--steps 30] [--warmup 8] [--repeats 2] [--threads 1] [--d-model 256]

Four runs of the same `tessera.llm.model.GPT` on the same batches through the real `Trainer`, each in a
fresh child process (so a peak is that run's own): activation checkpointing none/full x compile off/on,
set with the Trainer's `parallelism` setting (`{"data_parallel": "none", "activation_checkpointing":
"full", "compile": True}`, train/parallel/). Where that setting does not exist (an older tree) the
benchmark applies `torch.utils.checkpoint` and `torch.compile` to each block itself and says so.

The four configurations run `--repeats` times, interleaved, and each figure is the median over the
repeats. Per run: the median step after `--warmup` steps (compile's first steps include the compilation, shown
apart as "first steps"), the peak memory the Trainer reports (`summary/memory/*`: CUDA allocated peak on a
GPU; on a CPU the process's peak RSS, minus the RSS measured just before training, so the torch import is
not counted), and tokens/s. On a CPU these figures are indicative: checkpointing's recomputation costs
the same share there, but compile's gains and the allocator's behaviour differ from a GPU's; the GPU
figures come from `scripts/gpu-check.sh`. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from typing import Any

import torch
from trainer_overhead import ListLoader, StepClock, add_size_args, make_batches, step_median

from tessera.llm.model import GPT, GPTConfig
from tessera.train import Trainer

CONFIGS = [("none", False), ("full", False), ("none", True), ("full", True)]


def parallelism_setting(ac: str, compile_: bool) -> tuple[Any, str]:
    """(the Trainer's parallelism value, how the knobs are applied)."""
    try:
        from tessera.train.parallel import parse_parallelism
    except ImportError:
        return None, "direct (torch.utils.checkpoint / torch.compile per block)"
    return parse_parallelism({"data_parallel": "none", "activation_checkpointing": ac, "compile": compile_}), \
        "Trainer parallelism setting"


def apply_directly(model: GPT, ac: str, compile_: bool) -> None:
    from torch.utils.checkpoint import checkpoint

    for block in model.transformer.blocks:
        if ac == "full":
            forward = block.forward
            block.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)  # type: ignore
        if compile_:
            block.compile()


def child(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=args.d_model, n_heads=max(1, args.d_model // 64), n_layers=args.layers,
                          vocab_size=args.vocab, max_seq_len=args.seq))
    batches = make_batches(args)
    setting, how = parallelism_setting(args.ac, args.compile)
    if setting is None:
        apply_directly(model, args.ac, args.compile)
        extra: dict[str, Any] = {}
    else:
        extra = {"parallelism": setting}
    clock = StepClock()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    trainer = Trainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3), train_dataloader=ListLoader(batches),
                      max_duration=f"{args.steps}ba", log_interval=f"{args.steps}ba", loggers=[], callbacks=[clock],
                      precision=args.precision, **extra)
    trainer.fit()
    trainer.close()
    steps = [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]
    summary = trainer.summary
    peak = summary.get("summary/memory/allocated_peak_gb")
    if peak is None:
        peak = summary["summary/memory/rss_peak_gb"] - rss_before
    tokens = args.batch * args.seq
    step = step_median(clock.marks, args.warmup)
    return {"ac": args.ac, "compile": args.compile, "how": how, "device": str(trainer.device),
            "step_s": step, "first_steps_s": sum(steps[:args.warmup]), "tokens_per_sec": tokens / step,
            "peak_gb": peak, "params": model.num_params()}


def _median(found: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from a configuration's repeats: the median of each figure (an error if every run failed)."""
    ok = [r for r in found if "error" not in r]
    if not ok:
        return found[-1]
    row = dict(ok[0])
    for key in ("step_s", "first_steps_s", "tokens_per_sec", "peak_gb"):
        row[key] = statistics.median(r[key] for r in ok)
    row["step_s_runs"] = [r["step_s"] for r in ok]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_args(ap, steps=30, warmup=8, d_model=256, layers=4, seq=256, batch=8, vocab=8192)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved runs of the four configurations")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ac", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    common = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
              if k not in ("child", "ac", "compile", "repeats")]
    runs: dict[tuple[str, bool], list[dict[str, Any]]] = {config: [] for config in CONFIGS}
    for _ in range(args.repeats):
        for ac, compile_ in CONFIGS:
            cmd = [sys.executable, __file__, "--child", f"--ac={ac}", *common, *(["--compile"] if compile_ else [])]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode:
                runs[ac, compile_].append({"ac": ac, "compile": compile_,
                                           "error": (done.stderr.strip().splitlines() or ["?"])[-1]})
                continue
            runs[ac, compile_].append(json.loads(done.stdout.strip().splitlines()[-1]))
    rows = [_median(found) for found in runs.values()]
    ok = [r for r in rows if "error" not in r]
    base = next((r for r in ok if r["ac"] == "none" and not r["compile"]), None)
    if ok:
        print(f"GPT {ok[0]['params'] / 1e6:.1f}M params (d_model {args.d_model}, {args.layers} layers), batch "
              f"{args.batch} x {args.seq} tokens, {args.precision}, {args.steps} steps ({args.warmup} warm-up), "
              f"device {ok[0]['device']}, {args.threads} thread(s); knobs: {ok[0]['how']}")
    header = (f"{'AC':>5} | {'compile':>7} | {'step ms':>8} | {'vs base':>7} | {'first steps s':>13} | "
              f"{'tokens/s':>9} | {'peak GB':>7} | {'vs base':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        if "error" in r:
            print(f"{r['ac']:>5} | {r['compile']!s:>7} | failed: {r['error'][:100]}")
            continue
        speed = f"x{base['step_s'] / r['step_s']:.2f}" if base else "-"
        mem = f"x{r['peak_gb'] / base['peak_gb']:.2f}" if base and base["peak_gb"] > 0 else "-"
        print(f"{r['ac']:>5} | {r['compile']!s:>7} | {r['step_s'] * 1e3:>8.1f} | {speed:>7} | "
              f"{r['first_steps_s']:>13.1f} | {r['tokens_per_sec']:>9,.0f} | {r['peak_gb']:>7.3f} | {mem:>7}")
    print(json.dumps({"benchmark": "compile_ac", **{k: v for k, v in vars(args).items()
                                                      if k not in ("child", "ac", "compile")}, "rows": rows,
                      "runs": {f"ac={ac},compile={c}": found for (ac, c), found in runs.items()}}))


if __name__ == "__main__":
    main()
