"""Import the anchor libraries (mosaicml-streaming) inside tests and benchmarks.

`import streaming` imports torchvision, whose PyPI wheels cannot load beside the CPU torch we pin
("operator torchvision::nms does not exist"). Streaming only needs a few names from it at import time
(for its vision dataset classes, which we never use), so a minimal stand-in module tree is registered in
`sys.modules` first. Never import this from library code.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


def _install_torchvision_stub() -> None:
    """Register `torchvision` stand-ins unless a real, loadable torchvision is already imported."""
    if "torchvision" in sys.modules:
        return

    class VisionDataset:  # the base class streaming.vision subclasses; never instantiated here
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("torchvision stand-in: vision datasets are not available in tests")

    def _unavailable(*args: object, **kwargs: object) -> None:
        raise RuntimeError("torchvision stand-in: transforms are not available in tests")

    root = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    datasets.VisionDataset = VisionDataset
    datasets.CIFAR10 = VisionDataset
    functional.to_tensor = _unavailable
    transforms.functional = functional
    root.datasets = datasets
    root.transforms = transforms
    root.__version__ = "0.0.0+tessera-stub"
    for module in (root, datasets, transforms, functional):
        # transformers probes find_spec("torchvision"); a spec without package metadata makes it
        # conclude that torchvision is unavailable, which is the truth.
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
        sys.modules[module.__name__] = module


_install_torchvision_stub()

import streaming  # noqa: E402
from streaming import MDSWriter, StreamingDataset  # noqa: E402
from streaming.base.util import clean_stale_shared_memory  # noqa: E402

__all__ = ["streaming", "MDSWriter", "StreamingDataset", "clean_stale_shared_memory"]
