"""Checkpoint stall: how long the step loop is blocked by an async `CheckpointManager.save`, against a
synchronous `torch.save` + upload of the same state, to a local folder and to SeaweedFS (S3 on loopback).

    .venv/bin/python benchmarks/checkpoint.py [--params-m 12.5] [--repeats 2] [--no-s3]

The state is a model of `--params-m` million fp32 parameters plus AdamW's two moments (12.5M -> ~150 MB).
A loop of fixed-cost steps (a matmul) saves once; figures per target (medians over repeats):

    stall      seconds the loop is blocked inside save() (staging the tensors to host memory)
    slowdown   extra seconds the loop's other steps took while the save ran in the background (CPU and
               memory bandwidth shared with the writer thread), measured against the same loop without a save
    background seconds the background thread took to write, upload, commit
    sync       seconds of torch.save to a local file + upload of that file (the loop blocked for all of it)

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

import torch

from tessera.storage import open_store
from tessera.train.checkpoint import CheckpointManager, capture_state
from tessera.train.time import Timestamp


def make_state(params_m: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    width = 2048
    layers = max(1, round(params_m * 1e6 / (width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():  # materialise AdamW's moments without a real step
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    tensors = list(model.state_dict().values())
    tensors += [v for s in opt.state_dict()["state"].values() for v in s.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


class Loop:
    """Fixed-cost steps (~`step_ms` each); `run(save_at, save)` returns (loop seconds, seconds inside save)."""

    def __init__(self, steps: int, step_ms: float) -> None:
        self.steps = steps
        self.a = torch.randn(512, 512)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.2:
            self.a @ self.a
            reps += 1
        self.reps = max(1, round(reps * step_ms / 200))

    def step(self) -> None:
        for _ in range(self.reps):
            self.a @ self.a

    def run(self, save_at: int | None = None, save=None) -> tuple[float, float]:
        inside = 0.0
        t0 = time.perf_counter()
        for i in range(self.steps):
            self.step()
            if i == save_at:
                s0 = time.perf_counter()
                save()
                inside = time.perf_counter() - s0
        return time.perf_counter() - t0, inside


def measure(url: str, model, opt, loop: Loop, repeats: int, staging: str) -> dict[str, float]:
    mgr = CheckpointManager(url, num_to_keep=1, staging_dir=staging)
    store = open_store(url)
    stalls, slowdowns, backgrounds, syncs = [], [], [], []
    ts = Timestamp()
    # Warm-up save, untimed: a run's first save also allocates the host staging buffers that every
    # later save reuses; the table reports the steady state (the first save's stall is printed apart).
    t0 = time.perf_counter()
    mgr.save(capture_state(model, [opt], timestamp=ts), ts)
    first_stall = time.perf_counter() - t0
    mgr.wait()
    print(f"  {url}: first save stall {first_stall:.3f}s (allocates the staging buffers)", flush=True)
    for r in range(repeats):
        base, _ = loop.run()
        ts = ts.to_next_batch(1)

        def save_async(ts: Timestamp = ts) -> None:
            mgr.save(capture_state(model, [opt], timestamp=ts), ts)

        total, inside = loop.run(save_at=1, save=save_async)
        info = mgr.wait()
        stalls.append(inside)
        slowdowns.append(max(0.0, total - inside - base))
        backgrounds.append(info.write_seconds if info else float("nan"))

        def save_sync(key: str = f"sync/{r}.pt") -> None:
            path = Path(staging) / "sync.pt"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
            store.put_file(key, path)
            path.unlink()

        _, inside = loop.run(save_at=1, save=save_sync)
        syncs.append(inside)
        store.delete(f"sync/{r}.pt")
    mgr.close()
    med = statistics.median
    return {"stall_s": med(stalls), "slowdown_s": med(slowdowns), "background_s": med(backgrounds),
            "sync_s": med(syncs), "stall_share_of_sync": med(stalls) / med(syncs),
            "stall_plus_slowdown_share_of_sync": (med(stalls) + med(slowdowns)) / med(syncs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params-m", type=float, default=12.5, help="model parameters, millions")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--no-s3", action="store_true", help="skip SeaweedFS")
    args = ap.parse_args()
    model, opt = make_state(args.params_m)
    size = state_bytes(model, opt)
    loop = Loop(args.steps, args.step_ms)
    results = []
    server = None
    with tempfile.TemporaryDirectory(prefix="tessera-bench-ckpt-") as tmp:
        targets = [("local", str(Path(tmp) / "ckpt"))]
        if not args.no_s3:
            from tests_shared import tests_module

            start_server = tests_module("s3server").start_server

            server = start_server(buckets=("bench",))
            os.environ.update(server.env())
            targets.append(("s3", "s3://bench/ckpt"))
        try:
            staging = str(Path(tmp) / "staging")
            os.makedirs(staging)
            for name, url in targets:
                results.append({"target": name, **measure(url, model, opt, loop, args.repeats, staging)})
        finally:
            if server is not None:
                server.stop()
    print(f"state: {size / 1e6:.0f} MB ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params + AdamW), "
          f"step ~{args.step_ms:.0f} ms, {args.repeats} repeat(s), {os.cpu_count()} CPU(s)")
    header = f"{'target':>6} | {'stall':>8} | {'slowdown':>8} | {'background':>10} | {'sync save':>9} | {'stall/sync':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['target']:>6} | {r['stall_s']:>7.3f}s | {r['slowdown_s']:>7.3f}s | {r['background_s']:>9.3f}s | "
              f"{r['sync_s']:>8.3f}s | {r['stall_share_of_sync']:>9.1%}")
    print(json.dumps({"benchmark": "checkpoint", "state_bytes": size, "step_ms": args.step_ms,
                      "repeats": args.repeats, "results": results}))


if __name__ == "__main__":
    main()
