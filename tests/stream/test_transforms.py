"""Issue 12: transforms as MosaicML users write them, and a new iteration starting the next epoch.

MosaicML's examples subclass StreamingDataset and override `__getitem__` to transform each sample; that
must work through StreamingDataLoader's workers and the batch path. `transform=` does the same without a
subclass. And, as in MosaicML, iterating a dataset again (with no set_epoch / load_state_dict) serves the
next epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helpers
import numpy as np
import pytest
import torch
from PIL import Image

from tessera.shards import ShardWriter
from tessera.stream import StreamingDataLoader, StreamingDataset

N = 60


@pytest.fixture(scope="module")
def elastic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("transforms") / "elastic"
    helpers.write_elastic(root, range(N))
    return root


class Doubled(StreamingDataset):
    """The MosaicML pattern: call the parent's __getitem__, then transform."""

    def __getitem__(self, at: Any) -> Any:
        sample = super().__getitem__(at)
        return {"id": int(sample["id"]), "twice": np.asarray(sample["x"]) * 2}


def ids_and_payloads(batches: list[dict]) -> tuple[list[int], list[np.ndarray]]:
    ids = [int(i) for b in batches for i in b["id"]]
    return ids, [np.asarray(t) for b in batches for t in b["twice"]]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_path", [False, True])
def test_subclass_getitem_transforms_every_path(elastic: Path, workers: int, batch_path: bool) -> None:
    plain = StreamingDataset(local=str(elastic), batch_size=4, shuffle=True, shuffle_block_size=16)
    order = [int(s["id"]) for s in plain]
    ds = Doubled(local=str(elastic), batch_size=4, shuffle=True, shuffle_block_size=16)
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=workers, batch_path=batch_path)
    ids, twice = ids_and_payloads(list(loader))
    assert ids == order  # the same order as untransformed samples
    for i, t in zip(ids, twice, strict=True):
        np.testing.assert_array_equal(t, helpers.expected_x(i) * 2)


def to_array(sample: dict) -> dict:
    return {"id": sample["id"], "pixels": np.asarray(sample["img"].convert("L").resize((4, 4)), dtype=np.uint8)}


@pytest.mark.parametrize("workers", [0, 2])
def test_transform_argument_on_an_image_dataset_through_workers_and_batches(tmp_path: Path, workers: int) -> None:
    """An image column (PIL, variable size) turned into fixed arrays by transform=: the batch path stacks
    them; before issue 12 an image loader with a transform raised NotImplementedError."""
    with ShardWriter(tmp_path / "img", {"id": "int", "img": "png"}, size_limit=4000) as writer:
        for i in range(24):
            writer.write({"id": i, "img": Image.new("RGB", (5 + i % 3, 7), (i, 2 * i, 3 * i))})
    ds = StreamingDataset(local=str(tmp_path / "img"), batch_size=8, transform=to_array)
    assert ds[3]["pixels"].shape == (4, 4) and [s["id"] for s in ds[1:3]] == [1, 2]  # ds[...] too
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, batch_path=True)
    batches = list(loader)
    assert [b["pixels"].shape for b in batches] == [torch.Size([8, 4, 4])] * 3
    want = {i: to_array({"id": i, "img": Image.new("RGB", (5 + i % 3, 7), (i, 2 * i, 3 * i))})["pixels"]
            for i in range(24)}
    for b in batches:
        for i, px in zip(b["id"].tolist(), b["pixels"], strict=True):
            np.testing.assert_array_equal(px.numpy(), want[i])


def test_iterating_again_starts_the_next_epoch(elastic: Path) -> None:
    kw = {"local": str(elastic), "batch_size": 4, "shuffle": True, "shuffle_block_size": 16}
    ds = StreamingDataset(**kw)
    first, second = [int(s["id"]) for s in ds], [int(s["id"]) for s in ds]
    reference = StreamingDataset(**kw)
    reference.set_epoch(1)
    assert second == [int(s["id"]) for s in reference] and first != second
    assert sorted(first) == sorted(second) == list(range(N))
    ds.set_epoch(0)  # an explicit epoch is served as given, once
    assert [int(s["id"]) for s in ds] == first
    broken = StreamingDataset(**kw)
    next(iter(broken))  # an iteration broken off: the next one is still the next epoch (as in MosaicML)
    assert [int(b) for batch in broken.iter_batches() for b in batch["id"]] == second
