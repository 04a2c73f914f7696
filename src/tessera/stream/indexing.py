"""`ds[...]` as MosaicML Streaming's `Array` has it: an int, a slice, a list or a numpy array of indices.

A MosaicML user writes `ds[-1]`, `ds[10:20]`, `ds[[3, 1]]` or `ds[np.array(ids)]`; an int gives one
sample and the others a list of samples (nested lists for nested lists or 2-d arrays), each read
through `get_item`, the per-sample read that subclasses may wrap. Slices follow numpy's (and Python's)
rules, so `ds[a:b:c]` names the same indices as `np.arange(size)[a:b:c]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class SampleIndexError(IndexError):
    """A sample index outside the dataset (MosaicML raises IndexError here too)."""


class IndexKindError(TypeError, ValueError):
    """An index of a kind `ds[...]` does not take. MosaicML raises ValueError for it; this is both."""


def normalize_index(index: int, size: int, what: str = "dataset") -> int:
    """`index` as a position in [0, size): negative indices count from the end."""
    if -size <= index < 0:
        index += size
    if not 0 <= index < size:
        raise SampleIndexError(f"sample index {index} is out of range for a {what} of {size} samples")
    return index


def select(at: Any, size: int, get_item: Callable[[int], Any], what: str = "dataset") -> Any:
    """The item(s) at `at` of a sequence of `size` items read by `get_item(0 <= i < size)`."""
    if isinstance(at, (bool, np.bool_)):
        raise IndexKindError(f"{what}[{at!r}]: a bool is not a sample index (boolean masks are not supported)")
    if isinstance(at, (int, np.integer)):
        return get_item(normalize_index(int(at), size, what))
    if isinstance(at, slice):
        return [get_item(i) for i in range(*at.indices(size))]
    if isinstance(at, (list, np.ndarray)):
        if isinstance(at, np.ndarray) and at.dtype.kind not in "iu":
            raise IndexKindError(f"{what}[array of {at.dtype}]: sample indices must be integers")
        return [select(sub, size, get_item, what) for sub in at]
    raise IndexKindError(f"{what}[{type(at).__name__}]: index with an int, a slice, a list or a numpy array "
                         "of ints")
