"""The import contracts in pyproject.toml ([tool.importlinter]) hold: layers only import downwards, the
platform imports no training or data code, and no package has an import circle between its files.

CI runs only `make test`, so this is where a broken contract fails the build.
"""

import importlib
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


@pytest.mark.parametrize("layer", ["storage", "shards", "stream", "train", "llm", "platform"])
def test_every_exported_name_resolves(layer: str) -> None:
    """train and llm load their names on first use, from a table that could drift from __all__."""
    package = importlib.import_module(f"tessera.{layer}")
    missing = [name for name in package.__all__ if not hasattr(package, name)]
    assert not missing, f"tessera.{layer}.__all__ names {missing}, which do not resolve"


def test_time_units_and_tokenizers_load_without_torch() -> None:
    """Why train and llm export lazily: data prep workers and time arithmetic must not import torch."""
    code = ("import sys; from tessera.train import Time, TimeUnit; from tessera.llm import load_tokenizer; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stdout + result.stderr
