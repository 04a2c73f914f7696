"""The documentation site (mkdocs.yml: the guides in docs/ and the reference pages built from the
docstrings) builds with --strict, so a broken link, a nav entry without a page or a docstring that
mkdocstrings cannot render fails `make test`, which is all CI runs.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("storage", "shards", "stream", "train", "llm", "platform")


def exported_names(layer: str) -> list[str]:
    """The layer's __all__, read from its __init__.py without importing it (no torch needed)."""
    tree = ast.parse((ROOT / "src" / "tessera" / layer / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"tessera.{layer} has no literal __all__")


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    site = tmp_path / "site"
    result = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                            capture_output=True, text=True, timeout=240)
    if result.returncode != 0:
        pytest.fail(f"mkdocs build --strict exited {result.returncode}:\n{result.stdout}{result.stderr}",
                    pytrace=False)
    # Each layer's reference page has an entry for every name the layer exports.
    for layer in LAYERS:
        page = (site / "reference" / layer / "index.html").read_text()
        missing = [name for name in exported_names(layer) if f'id="tessera.{layer}.{name}"' not in page]
        assert not missing, f"docs/reference/{layer}.md renders no entry for {missing}"
