"""A fake `nvidia-smi` (and `dmesg`) for GPU pre-flight tests on machines without GPUs.

    python fake_nvidia_smi.py nvidia-smi ARGS...     (installed as `nvidia-smi` by `install(bin_dir, ...)`)
    python fake_nvidia_smi.py dmesg

What it reports comes from a scenario (JSON), picked from the folder named by $FAKE_GPU_DIR:
`<node>.json` for this node ($SLURMD_NODENAME, else the host name), else `default.json`. When the folder
holds `faulty.json` and a `claim` file that does not exist yet, the first node to run the fake claims the
fault (writes its name into `claim`) and reports `faulty.json` from then on; the others report the default.
That makes "one node of the first job is sick" deterministic without knowing which nodes Slurm picks.

Scenario keys: gpus: [{name, ecc (volatile uncorrectable count or "[N/A]"), retired_pending, remap_pending,
remap_failure}], remap_supported (bool), xids: [kernel lines], fail: text (nvidia-smi prints it, exits 9).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

HEALTHY_A100 = {"name": "NVIDIA A100-SXM4-40GB", "ecc": 0, "retired_pending": "No", "remap_pending": 0,
                "remap_failure": 0}


def install(bin_dir: Path, scenarios: Path) -> dict[str, str]:
    """Write `nvidia-smi` and `dmesg` wrappers into `bin_dir`; returns the environment that uses them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("nvidia-smi", "dmesg"):
        path = bin_dir / tool
        path.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} {tool} \"$@\"\n")
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "FAKE_GPU_DIR": str(scenarios)}


def write_scenario(folder: Path, scenario: str, gpus: int = 2, xids: list[str] | None = None,
                   **gpu: object) -> None:
    """`folder/<scenario>.json`: `gpus` GPUs like HEALTHY_A100, `gpu`'s overrides on GPU 1 (or GPU 0 alone)."""
    rows = [dict(HEALTHY_A100) for _ in range(gpus)]
    if rows and gpu:
        rows[min(1, gpus - 1)].update(gpu)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{scenario}.json").write_text(json.dumps({"gpus": rows, "xids": xids or []}))


def _scenario() -> dict:
    folder = Path(os.environ["FAKE_GPU_DIR"])
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    claim = folder / "claim"
    if (folder / "faulty.json").exists():
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, node.encode())
            os.close(fd)
        except FileExistsError:
            pass
        if claim.read_text().strip() == node:
            return json.loads((folder / "faulty.json").read_text())
    path = folder / f"{node}.json"
    return json.loads((path if path.exists() else folder / "default.json").read_text())


def _value(gpu: dict, index: int, field: str) -> str:
    bus = f"00000000:{0x10 + index:02X}:00.0"
    values = {"index": str(index), "uuid": f"GPU-fake-{index}", "pci.bus_id": bus, "gpu_bus_id": bus,
              "name": gpu["name"], "ecc.errors.uncorrected.volatile.total": str(gpu.get("ecc", 0)),
              "retired_pages.pending": gpu.get("retired_pending", "No"),
              "remapped_rows.pending": str(gpu.get("remap_pending", 0)),
              "remapped_rows.failure": str(gpu.get("remap_failure", 0))}
    return values[field]


def nvidia_smi(args: list[str], scenario: dict) -> int:
    if scenario.get("fail"):
        print(scenario["fail"])
        return 9
    query = next((a for a in args if a.startswith(("--query-gpu=", "--query-remapped-rows="))), None)
    if query is None:
        print(f"fake nvidia-smi: unsupported arguments {args}", file=sys.stderr)
        return 2
    if query.startswith("--query-remapped-rows=") and not scenario.get("remap_supported", True):
        print("Field \"remapped_rows.pending\" is not a valid field to query.")
        return 2
    fields = query.split("=", 1)[1].split(",")
    for i, gpu in enumerate(scenario["gpus"]):
        print(", ".join(_value(gpu, i, f) for f in fields))
    return 0


def main(argv: list[str]) -> int:
    tool, args = argv[0], argv[1:]
    scenario = _scenario()
    if tool == "dmesg":
        for n, line in enumerate(scenario.get("xids", [])):
            print(f"[{1000 + n}.123456] {line}")
        return 0
    return nvidia_smi(args, scenario)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
