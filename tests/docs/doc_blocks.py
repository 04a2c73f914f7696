"""Run the ```bash blocks of a Markdown document the way a reader would paste them: in order, in one
folder, each under `set -euo pipefail`, with `tessera` from this venv on PATH.

A block right after the line `<!-- docs-test: skip ... -->` is not run (the test provides what it does,
e.g. an S3 server). Anything else about a block is the document's text, unchanged, except for the
`replace` pairs a test passes (and asserts are in the document)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = "<!-- docs-test: skip"
FENCE = re.compile(r"^```bash\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    code: str
    line: int      # 1-based line of the opening fence
    skipped: bool


def bash_blocks(text: str) -> list[Block]:
    blocks = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        blocks.append(Block(match.group(1), text.count("\n", 0, match.start()) + 1, before.startswith(SKIP)))
    return blocks


def shell_env(extra: dict[str, str], tmp: Path) -> dict[str, str]:
    """This environment with the venv's bin first, no AWS profile, temp files (stream caches) in `tmp`."""
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "AWS_SESSION_TOKEN")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp)
    env.update(extra)
    return env


def run_block(block: Block, cwd: Path, env: dict[str, str], where: str, timeout: float = 600) -> str:
    """Run one block; on failure the assertion names the document line and shows the output."""
    script = "set -euo pipefail\nset -x\n" + block.code
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{where}:{block.line}: the block failed (exit {done.returncode}):\n{output[-4000:]}"
    assert "Traceback" not in output, f"{where}:{block.line}:\n{output[-4000:]}"
    return output
