"""The byte layout of an MDS shard file and the names of shard files.

```
u32 N | u32 off[0..N] | config JSON | sample 0 | ... | sample N-1      (off[N] == file size)
```
Kept in one place so the writer, repair and tests agree on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

_SHARD_NUMBER = re.compile(r"(?:^|/)shard\.(\d+)\.")


def config_bytes(config: dict[str, Any]) -> bytes:
    """The config JSON a shard embeds: `json.dumps(config, sort_keys=True)` in UTF-8."""
    return json.dumps(config, sort_keys=True).encode("utf-8")


def shard_header(config: bytes, sizes: Sequence[int] | np.ndarray) -> bytes:
    """`u32 N`, the N+1 absolute offsets, then the config: everything before the first sample."""
    count = len(sizes)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    offsets += 4 + 4 * (count + 1) + len(config)
    if offsets[-1] >= 1 << 32:
        raise ValueError(f"a shard of {offsets[-1]} bytes does not fit MDS's 32-bit offsets; lower size_limit")
    return np.uint32(count).tobytes() + offsets.astype("<u4").tobytes() + config


def shard_basenames(number: int, extension: str, compression_family: str | None) -> tuple[str, str | None]:
    """(raw basename, compressed basename or None), e.g. ("shard.00007.mds", "shard.00007.mds.zstd")."""
    raw = f"shard.{number:05}.{extension}"
    return raw, (f"{raw}.{compression_family}" if compression_family else None)


def shard_number(basename: str) -> int | None:
    """The number in a `shard.NNNNN.*` basename (sub-folders allowed), or None."""
    match = _SHARD_NUMBER.search(basename)
    return int(match.group(1)) if match else None
