"""A stand-in for `tessera train` that keeps the platform's contract (docs/platform.md): heartbeats to
$TESSERA_HEARTBEAT, checkpoint events to $TESSERA_HEARTBEAT.events.jsonl, a checkpoint on SIGTERM, and
autoresume from its last checkpoint. Imports nothing from Tessera.

    python fake_trainer.py --state DIR --steps N [--step-time S] [--fault KIND --at STEP]

DIR holds checkpoint.json ({"step"}) and steps.log (one line per step done: "<step> <resumption> <node>").
A fault happens once per DIR (marker file fault-KIND.done): crash (waits for a kill -9 by the test),
hang (stops heartbeating, ignores SIGTERM), oom (prints a CUDA OOM and exits 1), error (raises at the
step; with --at 0 that is a user error before any progress), exit3 (exits 3).
"""

import argparse
import json
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--state", required=True)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--step-time", type=float, default=0.1)
parser.add_argument("--fault", default=None)
parser.add_argument("--at", type=int, default=3)
parser.add_argument("--checkpoint-every", type=int, default=1)
args = parser.parse_args()

os.makedirs(args.state, exist_ok=True)
ckpt_path = os.path.join(args.state, "checkpoint.json")
heartbeat = os.environ.get("TESSERA_HEARTBEAT")
resumption = os.environ.get("TESSERA_RESUMPTION", "?")
node = os.environ.get("NODE_RANK", "0")
rank0 = node == "0"


def write_json(path, body):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, path)


def beat(step, status="running"):
    if heartbeat and rank0:
        write_json(heartbeat, {"kind": "heartbeat", "status": status, "time": time.time(), "step": step,
                               "pid": os.getpid(), "rank": 0, "run_name": os.environ.get("RUN_NAME")})


def event(kind, **fields):
    if heartbeat and rank0:
        with open(heartbeat + ".events.jsonl", "a") as f:
            f.write(json.dumps({"kind": kind, "time": time.time(), **fields}) + "\n")


step = 0
if os.path.exists(ckpt_path):
    with open(ckpt_path) as f:
        step = json.load(f)["step"]
print(f"start resumption={resumption} node={node} step={step} pid={os.getpid()} "
      f"master={os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} nnodes={os.environ.get('NNODES')}",
      flush=True)
with open(os.path.join(args.state, f"pid-{node}"), "w") as f:
    f.write(str(os.getpid()))


def checkpoint(done_steps):
    if rank0:
        write_json(ckpt_path, {"step": done_steps})
        event("checkpoint", step=done_steps, url=f"file://{ckpt_path}", name=f"ba{done_steps}")


def on_term(*_):
    print(f"SIGTERM at step {step}: checkpointing", flush=True)
    checkpoint(step)
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
event("fit_start", step=step)
beat(step)


def fault_once(kind):
    marker = os.path.join(args.state, f"fault-{kind}.done")
    if args.fault != kind or step != args.at or os.path.exists(marker):
        return False
    open(marker, "w").close()
    return True


while step < args.steps:
    if fault_once("crash"):
        print("waiting to be killed", flush=True)
        time.sleep(600)
    if fault_once("hang"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("hanging", flush=True)
        time.sleep(600)
    if fault_once("oom"):
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    if fault_once("error"):
        raise ValueError(f"bad value at step {step}")
    if fault_once("exit3"):
        sys.exit(3)
    time.sleep(args.step_time)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})   # a step is done (logged, counted) or not
    with open(os.path.join(args.state, "steps.log"), "a") as f:
        f.write(f"{step} {resumption} {node}\n")
    step += 1
    if step % args.checkpoint_every == 0:
        checkpoint(step)
    beat(step)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

event("fit_end", step=step)
beat(step, status="finished")
print(f"done at step {step}", flush=True)
