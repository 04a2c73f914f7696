#!/usr/bin/env bash
# Short trainings on this machine's GPU(s) and a table of what they reached, to check a GPU node (or a new
# torch/CUDA) before a long run:
#
#   scripts/gpu-check.sh                 # -> benchmarks/results/gpu-<name>.md (and the table on stdout)
#   STEPS=40 GPUS=8 scripts/gpu-check.sh  # more steps; 8 processes (FSDP shards over them)
#
# Runs `tessera train` on synthetic tokens (written here by a few lines of Python: nothing is downloaded):
# mpt-125m and mpt-1b with FSDP (param_dtype bfloat16), amp_bf16, each with activation checkpointing and
# torch.compile off and on, then a LoRA fine-tune of a Llama-shaped GPT (RoPE, RMSNorm, 1B shape). Every
# run logs Tessera's throughput metrics; the table holds each run's summary: tokens/s, MFU (peaks from
# tessera.train.hardware), peak allocated memory and the step time. With one GPU (GPUS=1) the run is one
# process and FSDP wraps nothing (the parallel plan of a world of one); GPUS>=2 shards for real.
#
# Needs a CUDA GPU: without one it prints one line and exits 3.
# Settings: STEPS (default 30), GPUS (default 1), PYTHON (default .venv/bin/python), OUT (the .md file).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "gpu-check: no CUDA GPU here (torch.cuda.is_available() is False for $PY); run it on a GPU node with a CUDA build of torch" >&2
    exit 3
fi

export GPU_CHECK_REPO="$REPO" GPU_CHECK_STEPS="${STEPS:-30}" GPU_CHECK_GPUS="${GPUS:-1}" GPU_CHECK_OUT="${OUT:-}"
exec "$PY" - <<'PYTHON'
import json, os, re, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch

from tessera.shards import ShardWriter

repo, steps, gpus = Path(os.environ["GPU_CHECK_REPO"]), int(os.environ["GPU_CHECK_STEPS"]), int(os.environ["GPU_CHECK_GPUS"])
name = torch.cuda.get_device_name(0)
slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
out = Path(os.environ["GPU_CHECK_OUT"] or repo / "benchmarks" / "results" / f"gpu-{slug}.md")
tessera = [str(Path(sys.executable).parent / "tessera"), "train"]
SEQ, VOCAB = int(os.environ.get("GPU_CHECK_SEQ", 2048)), 50368

work = Path(tempfile.mkdtemp(prefix="tessera-gpu-check-"))
data = work / "tokens"
rng = np.random.default_rng(0)
samples = max(64, steps * 8 * 2)
with ShardWriter(str(data / "train"), {"tokens": f"ndarray:uint16:{SEQ}"}) as writer:  # synthetic token windows
    for _ in range(samples):
        writer.write({"tokens": rng.integers(0, VOCAB, SEQ, dtype=np.uint16)})

common = [f"data.train.streams.0.remote={data}", "data.train.num_workers=2", "data.eval=null", "tokenizer=byte",
          f"model.vocab_size={VOCAB}", f"model.max_seq_len={SEQ}", "precision=amp_bf16", f"max_duration={steps}ba", "log_interval=5ba",
          "save_folder=null", "autoresume=false", "loggers=[jsonl]", "device_train_microbatch_size=auto",
          *os.environ.get("GPU_CHECK_EXTRA", "").split()]  # GPU_CHECK_EXTRA: more overrides (testing the script)
fsdp = ["parallelism.fsdp.sharding=full_shard", "parallelism.fsdp.param_dtype=bfloat16",
        "parallelism.fsdp.reduce_dtype=float32"]
runs = []
for model, batch in (("mpt-125m", 16 * gpus), ("mpt-1b", 8 * gpus)):
    for ac, comp in (("none", "false"), ("full", "false"), ("none", "true"), ("full", "true")):
        runs.append((f"{model}", ac, comp, f"{model}.yaml",
                     [*fsdp, f"global_train_batch_size={batch}", f"parallelism.activation_checkpointing={ac}",
                      f"parallelism.compile={comp}"]))
runs.append(("llama-shaped 1B, LoRA r16", "none", "true", "mpt-1b.yaml",
             [f"global_train_batch_size={8 * gpus}", "model.attn=rope", "model.norm=rmsnorm",
              "lora={rank: 16, alpha: 32, dropout: 0.0}", "parallelism.data_parallel=ddp",
              "parallelism.compile=true"]))

rows = []
for label, ac, comp, recipe, extra in runs:
    run_name = re.sub(r"[^a-z0-9]+", "-", f"{label}-ac-{ac}-compile-{comp}".lower()).strip("-")
    logs = work / "logs" / run_name
    cmd = [*tessera, recipe, *(["-n", str(gpus)] if gpus > 1 else []), *common, *extra,
           f"run_name={run_name}", f"log_dir={logs}"]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - started
    summary = {}
    metrics = logs / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            entry = json.loads(line)
            if "summary/time/train_sec" in entry:
                summary = {k.removeprefix("summary/"): v for k, v in entry.items()}
    status = "ok" if done.returncode == 0 else f"exit {done.returncode}: " + \
        (done.stderr.strip().splitlines() or ["?"])[-1][:120].replace("|", "/")
    rows.append((label, ac, comp, summary, status, seconds))
    print(f"{label} ac={ac} compile={comp}: {status} ({seconds:.0f} s)", file=sys.stderr, flush=True)

def fmt(value, spec):
    return "-" if value is None else format(value, spec)

lines = [f"# GPU check: {name}", "",
         f"`scripts/gpu-check.sh` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {gpus} GPU(s), "
         f"torch {torch.__version__}, CUDA {torch.version.cuda}, {steps} steps per run on synthetic tokens "
         f"(sequence {SEQ}), amp_bf16, FSDP full_shard with param_dtype bfloat16"
         + (" (one process: FSDP wraps nothing)" if gpus == 1 else "") + ". Figures are each run's "
         "`summary/*` metrics (training time only; compile's first steps included).", "",
         "| model | activation checkpointing | compile | tokens/s | MFU | peak allocated GB | step ms | status |",
         "|---|---|---|---|---|---|---|---|"]
for label, ac, comp, s, status, _ in rows:
    lines.append(f"| {label} | {ac} | {comp} | {fmt(s.get('throughput/tokens_per_sec'), ',.0f')} | "
                 f"{fmt(s.get('throughput/mfu'), '.1%')} | {fmt(s.get('memory/allocated_peak_gb'), '.2f')} | "
                 f"{fmt(s.get('time/step_sec') and s['time/step_sec'] * 1e3, ',.0f')} | {status} |")
table = "\n".join(lines) + "\n"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(table)
print(table)
print(f"written to {out}", file=sys.stderr)
sys.exit(0 if all(r[4] == "ok" for r in rows) else 1)
PYTHON
