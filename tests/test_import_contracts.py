"""The import contracts in pyproject.toml ([tool.importlinter]) hold: layers only import downwards, the
platform imports no training or data code, and no package has an import circle between its files.

CI runs only `make test`, so this is where a broken contract fails the build.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_lint_imports_keeps_every_contract() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True,
                            timeout=240)
    if result.returncode != 0:
        pytest.fail(f"lint-imports exited {result.returncode}:\n{result.stdout}{result.stderr}", pytrace=False)
