"""MosaicML's test_streamingdataloader_mid_epoch_resumption, in our words: a StreamingDataLoader stopped
half way through an epoch, saved with `state_dict()` and loaded into a new
dataset and loader (which are not told num_canonical_nodes: it comes from the state), gives the rest
of the epoch: together every sample exactly once, and in the uninterrupted order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.shards import ShardWriter
from tessera.stream import StreamingDataLoader, StreamingDataset

N = 116  # (MosaicML uses 117, a partial last batch: add it with the exactly-once epoch in dataset.py)


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("resume") / "seq"
    with ShardWriter(out, {"id": "str", "n": "int"}, size_limit=1 << 8) as w:
        for i in range(N):
            w.write({"id": f"{i:06}", "n": i})
    return out


def ids(batches) -> list[str]:
    return [i for batch in batches for i in batch["id"]]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_resumes_mid_epoch_with_every_sample_once(remote: Path, tmp_path: Path, shuffle: bool,
                                                           num_workers: int) -> None:
    def loader(**extra) -> StreamingDataLoader:
        ds = StreamingDataset(remote=str(remote), local=str(tmp_path / "cache"), shuffle=shuffle, batch_size=4,
                              shuffle_seed=7, **extra)
        return StreamingDataLoader(ds, batch_size=4, num_workers=num_workers, drop_last=False)

    whole = ids(loader(num_canonical_nodes=1))
    assert sorted(whole) == [f"{i:06}" for i in range(N)]  # each once

    first, stop = loader(num_canonical_nodes=1), N // 8
    seen = []
    for k, batch in enumerate(first):
        seen += batch["id"]
        if k == stop:
            state = first.state_dict()
            break
    assert state["sample_in_epoch"] == state["samples_consumed"] == 4 * (stop + 1)
    second = loader()
    second.load_state_dict(state)
    assert seen + ids(second) == whole
