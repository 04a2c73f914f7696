"""Tiny-model CPU training throughput with the thread count Tessera chooses, against one thread and all cores.

    .venv/bin/python benchmarks/cpu_threads.py [--repeats 3] [--busy 2] [--seconds 12]

Scenarios (rows), each run side by side in one invocation:
    idle     nothing started by the benchmark (other jobs on the machine are what they are: the load
             average before each scenario is printed)
    busy     --busy processes spinning on the CPU (`while True: pass`), started before the runs
    pinned   the run's affinity mask is one core (as Slurm or a cpuset gives), nothing else started
Thread counts (columns):
    default  what a run gets when nobody chose a count: `cpu_threads.choose_threads(cpu, None)`, as the
             Trainer calls it at a run's first start (the affinity mask, the cgroup quota, the CPUs
             other processes keep busy)
    1        torch_threads=1
    all      torch_threads=os.cpu_count(): every core of the machine (torch's own default outside a mask)
Each measurement is a fresh process (the choice is made at its start): the quickstart's tiny GPT (d_model
128, 4 layers, 4 heads, seq 128, batch 16, vocab 4096, AdamW) trains on pre-made batches; after --warmup
steps, tokens/s over the next --steps steps or --seconds seconds, whichever ends first. Counts run
interleaved, --repeats times; the median is shown, with the thread count `default` chose. Prints a table,
then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SCENARIOS = ("idle", "busy", "pinned")
COUNTS = ("default", "1", "all")


def child(args: argparse.Namespace) -> None:
    """One measurement, in this fresh process: pin, choose the threads, train, print one JSON line."""
    if args.pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import torch

    from tessera.llm.model import GPT, GPTConfig
    from tessera.train.cpu_threads import choose_threads

    chosen = {"default": None, "1": 1, "all": os.cpu_count()}[args.child]
    threads = choose_threads(torch.device("cpu"), chosen)
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=128, n_heads=4, n_layers=4, vocab_size=4096, max_seq_len=128))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    batches = [{"tokens": torch.randint(0, 4096, (16, 128), generator=gen)} for _ in range(4)]
    steps, start = 0, 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            start = time.perf_counter()
        loss = model(batches[i % len(batches)])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= args.warmup:
            steps += 1
            if time.perf_counter() - start > args.seconds:
                break
    seconds = time.perf_counter() - start
    print(json.dumps({"threads": threads, "tokens_per_s": steps * 16 * 128 / seconds, "steps": steps}))


def measure(args: argparse.Namespace, count: str, pin: bool) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", count, "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--seconds", str(args.seconds)] + (["--pin"] if pin else [])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def spinners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--busy", type=int, default=2, help="busy processes in the busy scenario")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=12.0, help="at most this long per measurement")
    ap.add_argument("--child", choices=COUNTS, help=argparse.SUPPRESS)
    ap.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    results: dict[str, dict[str, list[dict[str, float]]]] = {s: {c: [] for c in COUNTS} for s in SCENARIOS}
    loads = {}
    for scenario in SCENARIOS:
        loads[scenario] = os.getloadavg()[0]
        busy = spinners(args.busy) if scenario == "busy" else []
        try:
            time.sleep(1.0 if busy else 0.0)
            for _ in range(args.repeats):
                for count in COUNTS:
                    results[scenario][count].append(measure(args, count, pin=scenario == "pinned"))
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
    table: dict[str, dict[str, float]] = {}
    print(f"{os.cpu_count()} cores; tokens/s, median of {args.repeats} (default's thread count in brackets)")
    print(f"{'scenario':<10}{'load':>6}{'default':>18}{'1 thread':>12}{'all cores':>12}")
    for scenario in SCENARIOS:
        row = {c: statistics.median(r["tokens_per_s"] for r in results[scenario][c]) for c in COUNTS}
        chose = sorted({int(r["threads"]) for r in results[scenario]["default"]})
        table[scenario] = {**row, "default_threads": chose, "load": loads[scenario]}  # type: ignore[dict-item]
        print(f"{scenario:<10}{loads[scenario]:>6.1f}{row['default']:>12,.0f} [{','.join(map(str, chose))}]"
              f"{row['1']:>12,.0f}{row['all']:>12,.0f}")
    print(json.dumps({"cores": os.cpu_count(), "busy_processes": args.busy, "repeats": args.repeats,
                      "results": table, "runs": results}))


if __name__ == "__main__":
    main()
