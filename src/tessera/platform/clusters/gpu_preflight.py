"""GPU pre-flight of one node, run before the command (like launch.py: any Python 3, imports nothing from
Tessera, copied beside launch.py into the resumption folder). A node with a sick GPU is found here, in
seconds, instead of by a crash or a hang an hour into the run.

    python gpu_preflight.py --gpus 8 [--gpu-type a100_40gb] [--out DIR] [--timeout 60]
    python gpu_preflight.py --after [--out DIR]     (after the command: new kernel Xid lines to the log)

Checks, in order (docs/gpu-health.md):
1. `nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,ecc.errors.uncorrected.volatile.total,
   retired_pages.pending --format=csv,noheader,nounits`: as many GPUs as the run asks for (those in
   CUDA_VISIBLE_DEVICES when it is set), of the model `--gpu-type` names (MCLI's gpu types), none with
   volatile uncorrectable ECC errors or pages pending retirement.
2. `nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure`: no row remap
   pending (the GPU needs a reset) or failed (out of spare rows). Older GPUs/drivers: skipped with a note.
3. The kernel log since boot (`dmesg`, else `journalctl -k -b`): no Xid of the hardware kind (nvidia-smi does
   not report Xids). Unreadable (kernel.dmesg_restrict): skipped with a note.
4. A short NCCL all-reduce over the node's GPUs (torch.distributed, one process per GPU) when torch and
   CUDA are there; skipped with a note otherwise.

Writes node-R.preflight.json (R = node rank) with {"verdict": "ok"|"fault", "reason", "checks", "notes", ...},
prints one line per problem to stderr (the node's log), and exits 0, or FAULT_EXIT when the node is at
fault (the supervisor excludes it and restarts the run elsewhere), or 2 on bad arguments.
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

FAULT_EXIT = 86   # tessera.platform.supervision.gpu_health.PREFLIGHT_FAULT_EXIT
HERE = os.path.dirname(os.path.abspath(__file__))
GPU_FIELDS = ("index", "uuid", "pci.bus_id", "name", "ecc.errors.uncorrected.volatile.total",
              "retired_pages.pending")
REMAP_FIELDS = ("gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure")
# MCLI gpu_type -> (model token in nvidia-smi's product name, memory in GB when the name carries it)
GPU_TYPES = {
    "a100_40gb": ("A100", 40), "a100_80gb": ("A100", 80), "h100_80gb": ("H100", 80), "h100": ("H100", None),
    "h200": ("H200", None), "h200_141gb": ("H200", 141), "v100_16gb": ("V100", 16), "v100_32gb": ("V100", 32),
    "a10": ("A10", None), "a10g": ("A10G", None), "l4": ("L4", None), "l40s": ("L40S", None),
    "t4": ("T4", None), "b200": ("B200", None),
}
# Xids that mean the GPU or its link is faulty (NVIDIA's Xid catalog: reset the GPU, reboot, or replace it).
# 13, 31, 43 (engine exception, MMU fault, stopped channel) are usually the program's own doing.
HARDWARE_XIDS = {
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint", 62: "internal micro-controller halt",
    63: "row remapping / page retirement event", 64: "row remapping / page retirement failure",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
    140: "unrecovered ECC error",
}
XID_LINE = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<code>\d+)")


def _write_json(path, body):
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        json.dump(body, out, indent=1)
    os.replace(tmp, path)


def _run(argv, timeout):
    """(exit code, stdout, stderr) of `argv`; (None, "", why) when it cannot run or time out."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return None, "", f"{argv[0]} not found"
    except subprocess.TimeoutExpired:
        return None, "", f"`{' '.join(argv)}` did not answer within {timeout:g} s"
    except OSError as exc:
        return None, "", f"{argv[0]}: {exc}"
    return done.returncode, done.stdout, done.stderr


def _csv_rows(text, fields):
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(fields):
            rows.append(dict(zip(fields, values, strict=True)))
    return rows


def _number(value):
    try:
        return int(float(value))
    except ValueError:
        return None   # "[N/A]" (ECC off or unsupported), "[Not Supported]"


def _yes(value):
    return value.strip().lower() in ("yes", "1", "true")


def visible(rows, env):
    """The rows of the GPUs this node's processes will see (CUDA_VISIBLE_DEVICES: indices or UUIDs)."""
    wanted = env.get("CUDA_VISIBLE_DEVICES")
    if wanted is None or not wanted.strip():
        return rows
    keys = [w.strip() for w in wanted.split(",") if w.strip()]
    return [r for r in rows if r["index"] in keys or r["uuid"] in keys]


def model_matches(name, gpu_type):
    """True/False whether nvidia-smi's product name is the MCLI `gpu_type`; None for a type not known."""
    known = GPU_TYPES.get(gpu_type.strip().lower())
    if known is None:
        return None
    model, memory = known
    upper = name.upper()
    if not re.search(rf"(?<![A-Z0-9]){re.escape(model)}(?![A-Z0-9])", upper):
        return False
    size = re.search(r"(\d+)\s*GB", upper)
    return memory is None or size is None or int(size.group(1)) == memory


def check_gpus(args, env, faults, notes):
    """Checks 1 and 2 (nvidia-smi); returns the rows it saw."""
    code, out, err = _run([args.nvidia_smi, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"],
                          args.timeout)
    if code != 0:
        why = (err or out).strip().splitlines()[-1:] or [f"exit {code}"]
        faults.append(f"nvidia-smi failed: {why[0]} (the run asks for {args.gpus} GPU(s))")
        return []
    rows = visible(_csv_rows(out, GPU_FIELDS), env)
    if len(rows) < args.gpus:
        faults.append(f"{len(rows)} GPU(s) visible, the run asks for {args.gpus}")
    for row in rows:
        gpu = f"GPU {row['index']} ({row['pci.bus_id']}, {row['name']})"
        if args.gpu_type and model_matches(row["name"], args.gpu_type) is False:
            faults.append(f"{gpu} is not a {args.gpu_type}")
        ecc = _number(row["ecc.errors.uncorrected.volatile.total"])
        if ecc:
            faults.append(f"{gpu} has {ecc} uncorrectable ECC error(s) since the driver loaded "
                          "(ecc.errors.uncorrected.volatile.total)")
        if _yes(row["retired_pages.pending"]):
            faults.append(f"{gpu} has memory pages pending retirement: reboot it (retired_pages.pending)")
    if args.gpu_type and rows and model_matches(rows[0]["name"], args.gpu_type) is None:
        notes.append(f"gpu type {args.gpu_type!r} is not one this check knows; model not checked")
    code, out, err = _run([args.nvidia_smi, f"--query-remapped-rows={','.join(REMAP_FIELDS)}",
                           "--format=csv,noheader,nounits"], args.timeout)
    if code != 0:
        notes.append("row remapping not reported (GPU before Ampere, or driver): skipped")
        return rows
    buses = {r["pci.bus_id"] for r in rows}
    for row in _csv_rows(out, REMAP_FIELDS):
        if buses and row["gpu_bus_id"] not in buses:
            continue
        if _yes(row["remapped_rows.failure"]):
            faults.append(f"GPU {row['gpu_bus_id']}: a row remapping failed, no spare rows left "
                          "(remapped_rows.failure)")
        elif _yes(row["remapped_rows.pending"]):
            faults.append(f"GPU {row['gpu_bus_id']}: a row remapping is pending, the GPU needs a reset "
                          "(remapped_rows.pending)")
    return rows


def kernel_log(timeout):
    """The kernel's messages since boot, or None when this user may not read them."""
    for argv in (["dmesg"], ["journalctl", "-k", "-b", "--no-pager", "-q"]):
        code, out, _ = _run(argv, timeout)
        if code == 0:
            return out
    return None


def xid_lines(text):
    """(code, line) of every NVRM Xid line in `text`."""
    out = []
    for line in text.splitlines():
        match = XID_LINE.search(line)
        if match:
            out.append((int(match.group("code")), line.strip()))
    return out


def check_kernel(args, faults, notes, body):
    text = kernel_log(args.timeout)
    if text is None:
        notes.append("kernel log not readable by this user (dmesg, journalctl -k): Xids not checked")
        return
    xids = xid_lines(text)
    body["kernel_xids"] = len(xids)
    for code, line in xids:
        if code in HARDWARE_XIDS:
            faults.append(f"Xid {code} ({HARDWARE_XIDS[code]}) since boot: {line}")


ALLREDUCE_WORKER = """
import datetime, os, sys, torch, torch.distributed as dist
rank, world = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + sys.argv[3], rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=float(sys.argv[4])))
x = torch.ones(16 * 1024 * 1024, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
    x.div_(world)
torch.cuda.synchronize()
ok = bool(torch.all(x == 1.0).item())
dist.destroy_process_group()
sys.exit(0 if ok else 3)
"""


def check_allreduce(args, faults, notes, rows):
    """A 64 MiB NCCL all-reduce, three times, over every visible GPU of the node: catches broken NVLink,
    P2P and driver states that nvidia-smi reports as healthy."""
    if args.no_allreduce or len(rows) < 2:
        notes.append("all-reduce skipped (fewer than 2 GPUs)" if not args.no_allreduce else "all-reduce skipped")
        return
    if not os.path.exists("/proc/driver/nvidia/version"):
        notes.append("all-reduce skipped: no NVIDIA kernel driver loaded (/proc/driver/nvidia/version)")
        return
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    code, _, _ = _run([sys.executable, "-c", probe], args.timeout)
    if code != 0:
        notes.append("all-reduce skipped: torch with CUDA is not importable by this python")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = len(rows)
    procs = [subprocess.Popen([sys.executable, "-c", ALLREDUCE_WORKER, str(r), str(world), str(port),
                               str(args.timeout)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    deadline = time.monotonic() + args.timeout
    failed = []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            failed.append(f"rank {rank} hung")
            continue
        if proc.returncode != 0:
            failed.append(f"rank {rank} exit {proc.returncode}: {(out.strip().splitlines() or [''])[-1][:300]}")
    if failed:
        faults.append(f"NCCL all-reduce over {world} GPUs failed: {'; '.join(failed)}")


def identity(env):
    rank = int(env.get("SLURM_NODEID") or env.get("NODE_RANK") or 0)
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return rank, node


def preflight(args, env):
    rank, node = identity(env)
    faults, notes = [], []
    body = {"rank": rank, "node": node, "gpus_requested": args.gpus, "gpu_type": args.gpu_type,
            "time": time.time()}
    if shutil.which(args.nvidia_smi) is None:
        faults.append(f"nvidia-smi not found ({args.nvidia_smi}): the run asks for {args.gpus} GPU(s)")
        rows = []
    else:
        rows = check_gpus(args, env, faults, notes)
    check_kernel(args, faults, notes, body)
    if not faults:
        check_allreduce(args, faults, notes, rows)
    body.update(verdict="fault" if faults else "ok", reason=faults[0] if faults else None, faults=faults,
                notes=notes, gpus=[{k: r[k] for k in ("index", "pci.bus_id", "name")} for r in rows])
    _write_json(os.path.join(args.out, f"node-{rank}.preflight.json"), body)
    for line in notes:
        print(f"tessera gpu-preflight: node {node}: {line}", file=sys.stderr, flush=True)
    # The launcher reports a failed step by its last line: the first fault comes last.
    for line in faults[1:] + faults[:1]:
        print(f"tessera gpu-preflight: node {node} FAULT: {line}", file=sys.stderr, flush=True)
    if not faults:
        print(f"tessera gpu-preflight: node {node}: {len(rows)} GPU(s) healthy", file=sys.stderr, flush=True)
    return FAULT_EXIT if faults else 0


def after(args, env):
    """After the command: print the Xid lines the kernel logged since the pre-flight, so the node's log
    (what the supervisor classifies) holds what the kernel saw while the run failed."""
    rank, node = identity(env)
    try:
        with open(os.path.join(args.out, f"node-{rank}.preflight.json")) as f:
            seen = int(json.load(f).get("kernel_xids", 0))
    except (OSError, ValueError):
        seen = 0
    text = kernel_log(args.timeout)
    for _, line in xid_lines(text or "")[seen:]:
        print(f"tessera gpu-postmortem: node {node} kernel: {line}", file=sys.stderr, flush=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="gpu_preflight.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="GPUs the run asks for on this node")
    parser.add_argument("--gpu-type", default=None, help="MCLI gpu type, e.g. a100_40gb, h100_80gb")
    parser.add_argument("--out", default=HERE, help="folder for node-R.preflight.json (default: beside this file)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per command and for the all-reduce")
    parser.add_argument("--nvidia-smi", default=os.environ.get("TESSERA_NVIDIA_SMI", "nvidia-smi"))
    parser.add_argument("--no-allreduce", action="store_true", help="skip the NCCL all-reduce")
    parser.add_argument("--after", action="store_true", help="report kernel Xids logged since the pre-flight")
    args = parser.parse_args(argv)
    if args.gpus < 0 or args.timeout <= 0:
        print("gpu_preflight.py: --gpus must be >= 0 and --timeout > 0", file=sys.stderr)
        return 2
    if not os.path.isdir(args.out):
        print(f"gpu_preflight.py: --out {args.out} is not a folder", file=sys.stderr)
        return 2
    return after(args, os.environ) if args.after else preflight(args, os.environ)


if __name__ == "__main__":
    sys.exit(main())
