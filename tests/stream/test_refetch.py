"""A cached shard deleted while an epoch runs is fetched again (MosaicML's get_item retries a missing
shard file), on a real S3 server (SeaweedFS): the epoch still serves every sample exactly, in the same
order and with the same bytes as an undisturbed epoch.
"""

from __future__ import annotations

import os
from pathlib import Path

import helpers
import numpy as np
import pytest

from tessera.storage.local import is_temp_name
from tessera.stream import StreamingDataLoader, StreamingDataset

N = 300


@pytest.fixture
def remote(s3_bucket: str) -> str:
    url = f"{s3_bucket}/elastic"
    helpers.write_elastic(url, range(N), size_limit=1400)  # ~12 shards
    return url


def delete_cached_shards(cache: Path) -> int:
    """Every complete shard file in the cache (a download in flight is left to finish)."""
    files = [f for f in helpers.shard_files(cache) if not is_temp_name(Path(f).name)]
    for f in files:
        os.unlink(f)
    return len(files)


def check_sample(sample: dict) -> int:
    i = int(sample["id"])
    assert np.array_equal(np.asarray(sample["x"]), helpers.expected_x(i)) and sample["s"] == helpers.expected_s(i)
    return i


@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_deleted_mid_epoch_are_fetched_again(remote: str, tmp_path: Path, shuffle: bool) -> None:
    """Unshuffled, the reader goes shard by shard: at each deletion some shards are open (read on from
    their mapping), some were fetched ahead and some not yet. Shuffled, a block spans every shard, so
    all are open by then and the deletion must simply not disturb them."""
    settings = dict(remote=remote, batch_size=10, shuffle=shuffle, shuffle_seed=4, predownload=40, num_canonical_nodes=1)
    reference = [check_sample(s) for s in StreamingDataset(local=str(tmp_path / "ref"), **settings)]
    assert sorted(reference) == list(range(N))

    ds = StreamingDataset(local=str(tmp_path / "cache"), **settings)
    got, deleted = [], 0
    for k, sample in enumerate(ds):
        got.append(check_sample(sample))
        if k in (N // 3, 2 * N // 3):
            ds.prepare_shard(ds.num_shards - 1)  # surely cached by now (unshuffled: not yet read)
            deleted += delete_cached_shards(tmp_path / "cache")
    assert deleted > 0 and got == reference
    downloads = sum(st.cache.stats.downloads for st in ds.streams)
    assert downloads > ds.num_shards or shuffle  # unshuffled, the last shard came again at least

    delete_cached_shards(tmp_path / "cache")  # random access after the epoch: every shard again
    assert [check_sample(s) for s in ds[:]] == list(range(N))
    assert sum(st.cache.stats.downloads for st in ds.streams) == downloads + ds.num_shards


def test_shards_deleted_under_dataloader_workers_are_fetched_again(remote: str, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=remote, local=str(tmp_path / "cache"), batch_size=10, num_canonical_nodes=1)
    loader = StreamingDataLoader(ds, batch_size=10, num_workers=2)
    got = []
    for k, batch in enumerate(loader):
        got += [check_sample({"id": i, "x": x, "s": s})
                for i, x, s in zip(batch["id"].tolist(), batch["x"].numpy(), batch["s"], strict=True)]
        if k == 10:
            assert delete_cached_shards(tmp_path / "cache") > 0
    assert sorted(got) == list(range(N))
