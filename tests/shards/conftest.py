"""Fixtures of the shard tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from shard_helpers import MIXED_COLUMNS, mixed_sample

from tessera.shards import ShardWriter


@pytest.fixture
def make_dataset(tmp_path: Path) -> Callable[..., Path]:
    """make_dataset(n, columns=MIXED_COLUMNS, sample=mixed_sample, name="ds", **writer_kwargs) -> folder."""

    def make(n: int, columns: dict[str, str] | None = None, sample: Callable[[int], dict] = mixed_sample,
             name: str = "ds", **kwargs: object) -> Path:
        out = tmp_path / name
        with ShardWriter(out, columns or MIXED_COLUMNS, **kwargs) as writer:
            for i in range(n):
                writer.write(sample(i))
        return out

    return make
