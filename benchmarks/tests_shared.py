"""The helpers the benchmarks share with the tests, loaded from tests/ by file name.

Two of them: `s3server` (the loopback SeaweedFS server) and `anchors` (the torchvision stand-in, then
`import streaming`). One copy of each lives in tests/; a benchmark run as a script has only its own
folder on its path, so it loads them from their files here instead of putting tests/ on `sys.path`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parents[1] / "tests"


def tests_module(name: str) -> ModuleType:
    """tests/NAME.py as the module `name` (once per process; later calls return the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TESTS / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"no helper {name!r} in {TESTS}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # before running it: dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
