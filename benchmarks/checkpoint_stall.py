"""Checkpoint stall in a real 2-process training loop: how much slower are the steps around a save?

    .venv/bin/python benchmarks/checkpoint_stall.py [--width 1024] [--layers 8] [--steps 48] [--no-s3]

Two gloo ranks (this script started twice, as torchrun would) train an MLP with AdamW, under DDP and
under FSDP2, and save an async checkpoint (`CheckpointManager`) every `--save-every` steps to a local
folder and to SeaweedFS (S3 on loopback). Each is run twice: with the writer bounds (`bounded`: the
defaults, throttle.py: one upload thread on this machine, writer threads niced +10) and without them
(`unbounded`: 4 upload threads, normal priority). Rank 0 times every step (the ranks meet in each
step's gradient collective, so a slow rank shows up on rank 0). Figures per run, medians:

    normal      a step with no save in flight (and not the save step)
    save step   the step that calls save(): includes the stall of staging the state to host memory
    after       the `--after` steps right after a save, while the background writer runs
    after/normal  the stall the writer causes, as a ratio (1.0 = none)
    write       seconds the background thread took for one save (write, hash, upload, commit)

With `--repeats N` the settings run N times, interleaved (so a load that comes and goes hits them alike),
and the table shows the medians over the repeats. Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve()


def worker(args: argparse.Namespace) -> None:
    """One rank: train `args.steps` steps, saving every `args.save_every`; rank 0 writes its timings."""
    import torch.distributed as dist

    from tessera.train.checkpoint import CheckpointManager, capture_state
    from tessera.train.time import Timestamp

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    model: torch.nn.Module = torch.nn.Sequential(*layers)
    if args.parallelism == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    bounds = {} if args.mode == "bounded" else {"upload_threads": 4, "writer_nice": 0}
    manager = CheckpointManager(args.url, num_to_keep=1, **bounds)
    x = torch.randn(args.batch, args.width)
    ts, times, saves, writes = Timestamp(), [], [], []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ts = ts.to_next_batch(args.batch)
        if step % args.save_every == 0:
            info = manager.wait()  # the previous save: done long ago, so this does not block
            if info is not None:
                writes.append(info.write_seconds)
            manager.save(capture_state(model, [opt], timestamp=ts), ts)
            saves.append(step)
        times.append(time.perf_counter() - t0)
    info = manager.wait()
    writes.append(info.write_seconds if info else float("nan"))
    manager.close()
    if rank == 0:
        Path(args.out).write_text(json.dumps({"times": times, "saves": saves, "writes": writes}))
    dist.barrier()
    dist.destroy_process_group()


def summarize(record: dict, after: int) -> dict[str, float]:
    times, saves = record["times"], set(record["saves"])
    save_steps = [times[s - 1] for s in saves]
    after_steps = [times[s - 1 + k] for s in saves for k in range(1, after + 1) if s - 1 + k < len(times)]
    busy = {s + k for s in saves for k in range(0, after + 1)}
    normal = [t for i, t in enumerate(times, start=1) if i not in busy and i > 2]  # steps 1-2: warm-up
    med = statistics.median
    return {"normal_s": med(normal), "save_step_s": med(save_steps), "after_s": med(after_steps),
            "after_over_normal": med(after_steps) / med(normal), "save_over_normal": med(save_steps) / med(normal),
            "write_s": med(record["writes"]), "saves": len(saves)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_pair(args: argparse.Namespace, parallelism: str, mode: str, url: str, out: Path) -> dict:
    port, procs = str(free_port()), []
    cmd = [sys.executable, str(HERE), "--worker", "--parallelism", parallelism, "--mode", mode, "--url", url,
           "--out", str(out), "--width", str(args.width), "--layers", str(args.layers), "--batch",
           str(args.batch), "--steps", str(args.steps), "--save-every", str(args.save_every)]
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, env=env))
    for proc in procs:
        if proc.wait(timeout=600) != 0:
            raise SystemExit(f"a {parallelism} rank failed (exit {proc.returncode})")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8, help="8 x 1024^2 -> 8.4M params, ~100 MB with AdamW")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--save-every", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each setting, interleaved; medians")
    ap.add_argument("--after", type=int, default=4, help="steps after a save counted as 'after'")
    ap.add_argument("--no-s3", action="store_true", help="skip SeaweedFS")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--parallelism", default="ddp", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="bounded", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-stall-") as tmp, contextlib.ExitStack() as stack:
        targets = [("local", str(Path(tmp) / "ckpt"))]
        if not args.no_s3:
            from tests_shared import tests_module

            server = tests_module("s3server").start_server(buckets=("bench",))
            stack.callback(server.stop)
            os.environ.update(server.env())
            targets.append(("s3", "s3://bench/ckpt"))
        runs: dict[tuple[str, str, str], list[dict[str, float]]] = {}
        for _, (target, url), parallelism, mode in itertools.product(range(args.repeats), targets, ("ddp", "fsdp"),
                                                                     ("bounded", "unbounded")):
            record = run_pair(args, parallelism, mode, f"{url}/{parallelism}-{mode}", Path(tmp) / "times.json")
            row = summarize(record, args.after)
            runs.setdefault((target, parallelism, mode), []).append(row)
            print(json.dumps({"target": target, "parallelism": parallelism, "mode": mode, **row}), flush=True)
        for (target, parallelism, mode), rows in runs.items():  # medians over the repeats
            results.append({"target": target, "parallelism": parallelism, "mode": mode,
                            **{key: statistics.median(row[key] for row in rows) for key in rows[0]}})
    params = args.layers * (args.width * args.width + args.width)
    print(f"\n{params / 1e6:.1f}M params + AdamW ({params * 12 / 1e6:.0f} MB state), 2 gloo ranks, batch "
          f"{args.batch}, {args.steps} steps, a save every {args.save_every}, {os.cpu_count()} CPU(s)")
    print("\n".join(table(results)))
    print(json.dumps({"benchmark": "checkpoint_stall", "params": params, "batch": args.batch, "steps": args.steps,
                      "save_every": args.save_every, "after": args.after, "repeats": args.repeats, "cpus": os.cpu_count(),
                      "results": results}))


def table(results: list[dict]) -> list[str]:
    columns = [("target", 6, lambda r: r["target"]), ("par", 4, lambda r: r["parallelism"]),
               ("writer", 9, lambda r: r["mode"]), ("normal", 7, lambda r: f"{r['normal_s'] * 1e3:.0f}ms"),
               ("save step", 9, lambda r: f"{r['save_step_s'] * 1e3:.0f}ms"),
               ("after", 7, lambda r: f"{r['after_s'] * 1e3:.0f}ms"),
               ("after/normal", 12, lambda r: f"{r['after_over_normal']:.2f}"),
               ("write", 6, lambda r: f"{r['write_s']:.2f}s")]
    header = " | ".join(f"{name:>{width}}" for name, width, _ in columns)
    rows = [" | ".join(f"{cell(r):>{width}}" for _, width, cell in columns) for r in results]
    return [header, "-" * len(header), *rows]


if __name__ == "__main__":
    main()
