"""scripts/gpu-check.sh refuses cleanly on a machine without a CUDA GPU: one line, a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the script would train")
def test_without_cuda_it_says_so_in_one_line(tmp_path):
    out = tmp_path / "gpu.md"
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable, "OUT": str(out)})
    assert done.returncode == 3
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA GPU here"), done.stderr
    assert not out.exists()
