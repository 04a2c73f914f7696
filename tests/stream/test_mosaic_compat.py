"""The behaviours a MosaicML Streaming user relies on, as MosaicML's own tests check them
(benchmarks/streaming_own_tests.py runs those): each test here pins one of them down exactly, on small
data, in-process."""

from __future__ import annotations

import gc
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import helpers
import pytest

from tessera.shards import IndexFormatError
from tessera.storage.state_folder import state_folder
from tessera.stream import (
    Stream,
    StreamingDataLoader,
    StreamingDataset,
    clean_stale_shared_memory,
    generate_work,
    streams_registry,
)
from tessera.stream.world import World


def test_local_holds_exactly_what_remote_holds(tmp_path: Path) -> None:
    """Tessera's locks, stamps, journal and packed index live beside `local`, not in it."""
    remote, local = tmp_path / "remote", tmp_path / "local"
    helpers.write_elastic(remote, range(300), size_limit=600)
    ds = StreamingDataset(remote=str(remote), local=str(local), batch_size=4, shuffle=True)
    ids = [int(i) for batch in StreamingDataLoader(ds, batch_size=4, num_workers=2) for i in batch["id"]]
    assert sorted(ids) == list(range(300))
    assert sorted(os.listdir(local)) == sorted(os.listdir(remote))
    assert state_folder(local) == tmp_path / ".local.tessera"
    assert {p.name for p in state_folder(local).iterdir()} >= {"index.packed", "locks", "stamps", "downloads.log"}


def test_a_cache_with_the_state_inside_keeps_it_there(tmp_path: Path) -> None:
    """A cache folder an earlier Tessera filled (state in `local/.tessera`) is used as it is: its shards
    are not downloaded again, and processes of both versions keep sharing its locks."""
    remote, local = tmp_path / "remote", tmp_path / "local"
    helpers.write_elastic(remote, range(100), size_limit=600)
    (local / ".tessera").mkdir(parents=True)
    assert state_folder(local) == local / ".tessera"
    assert {int(s["id"]) for s in StreamingDataset(remote=str(remote), local=str(local), batch_size=4)} == set(range(100))
    assert not (tmp_path / ".local.tessera").exists()
    assert (local / ".tessera" / "downloads.log").is_file()


def test_evict_shard_removes_its_files_and_a_read_brings_them_back(tmp_path: Path) -> None:
    remote, local = tmp_path / "remote", tmp_path / "local"
    helpers.write_elastic(remote, range(120), size_limit=600, compression="zstd")
    ds = StreamingDataset(remote=str(remote), local=str(local), batch_size=4, keep_zip=True)
    for shard in range(ds.num_shards):
        ds.prepare_shard(shard)
    full = sorted(os.listdir(local))
    assert len(full) == 1 + 2 * ds.num_shards and ds.cache_usage == sum(p.stat().st_size for p in local.iterdir())
    assert int(ds[0]["id"]) == 0  # shard 0 is open in this process: eviction closes it first
    assert all(ds.evict_shard(shard) for shard in range(ds.num_shards))
    assert os.listdir(local) == ["index.json"] and ds.cache_usage == (local / "index.json").stat().st_size
    assert [int(ds[i]["id"]) for i in range(ds.num_samples)] == list(range(120))
    assert sorted(os.listdir(local)) == full
    clean_stale_shared_memory()  # MosaicML's clean-up: Tessera has nothing to clean, and nothing changes
    assert sorted(os.listdir(local)) == full and [int(s["id"]) for s in ds] == list(range(120))
    only_copy = StreamingDataset(local=str(remote), batch_size=4)
    with pytest.raises(ValueError, match="only copy of the data"):
        only_copy.evict_shard(0)
    assert sorted(os.listdir(remote)) == sorted(p for p in full if not p.endswith(".mds"))


def test_cache_limit_counts_the_index_and_is_refused_below_it(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    helpers.write_elastic(remote, range(600), size_limit=600)
    index = (remote / "index.json").stat().st_size
    shard = max(e["raw_data"]["bytes"] for e in json.loads((remote / "index.json").read_text())["shards"])
    with pytest.raises(ValueError, match=rf"^Minimum cache usage \({index} bytes, the index.json files\) is larger "
                                         rf"than the cache limit \({index} bytes\)"):
        StreamingDataset(remote=str(remote), local=str(tmp_path / "a"), batch_size=4, cache_limit=index)
    with pytest.raises(ValueError, match=rf"^Cache limit \({index + 2 * shard - 1} bytes\) is too low. Increase "
                                         rf"the `cache_limit` to at least {index + 2 * shard} bytes"):
        StreamingDataset(remote=str(remote), local=str(tmp_path / "b"), batch_size=4, cache_limit=index + 2 * shard - 1)
    limit = index + 4 * shard
    ds = StreamingDataset(remote=str(remote), local=str(tmp_path / "c"), batch_size=4, cache_limit=limit)
    assert [int(ds[i]["id"]) for i in range(600)] == list(range(600))
    assert ds.cache_usage <= limit and sum(p.stat().st_size for p in (tmp_path / "c").iterdir()) <= limit


def test_mosaics_warnings_for_a_small_predownload_and_shuffle_block(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    helpers.write_elastic(remote, range(200), size_limit=1400)
    with pytest.warns(UserWarning, match=r"^predownload < batch_size \(4 < 8\). This may result in slower batch"):
        StreamingDataset(remote=str(remote), local=str(tmp_path / "a"), batch_size=8, predownload=4)
    largest = int(max(StreamingDataset(remote=str(remote), local=str(tmp_path / "a"), batch_size=4).samples_per_shard))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # at construction, none: MosaicML warns of the block per epoch
        ds = StreamingDataset(remote=str(remote), local=str(tmp_path / "b"), batch_size=4, shuffle=True,
                              shuffle_block_size=largest - 1, predownload=4)
    for _epoch in range(2):
        with pytest.warns(UserWarning, match=rf"^Shuffle block size was smaller than shard size for some shards: "
                                             rf"shuffle_block_size={largest - 1} < {largest} samples"):
            assert sorted(int(s["id"]) for s in ds) == list(range(200))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for settings in ({"shuffle_block_size": largest}, {"shuffle_block_size": 2, "shuffle_algo": "naive"},
                         {"shuffle_block_size": 2, "shuffle": False}):
            ds = StreamingDataset(remote=str(remote), local=str(tmp_path / "b"), batch_size=4,
                                  **{"shuffle": True, **settings})
            assert sorted(int(s["id"]) for s in ds) == list(range(200))


def test_one_local_serves_one_remote_while_a_dataset_uses_it(tmp_path: Path) -> None:
    one, two, local = tmp_path / "one", tmp_path / "two", tmp_path / "local"
    helpers.write_elastic(one, range(50))
    helpers.write_elastic(two, range(1000, 1050))
    first = StreamingDataset(remote=str(one), local=str(local), batch_size=4)
    again = StreamingDataset(remote=str(one), local=str(local), batch_size=2)  # the same remote: shared
    with pytest.raises(ValueError, match=rf"^Reused local directory: {local} is in use by a dataset of "
                                         rf"{one}/index.json, vs {two}/index.json now. Provide a different one"):
        StreamingDataset(remote=str(two), local=str(local), batch_size=4)
    assert (local / "index.json").read_bytes() == (one / "index.json").read_bytes()  # untouched
    assert {int(s["id"]) for s in first} == {int(s["id"]) for s in again} == set(range(50))
    del first, again
    gc.collect()
    later = StreamingDataset(remote=str(two), local=str(local), batch_size=4)  # nobody uses it: taken over
    assert {int(s["id"]) for s in later} == set(range(1000, 1050))


class TaggedStream(Stream):
    """A user's Stream subclass with a field of its own, registered by name."""

    def __init__(self, *, tag: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tag = tag


def test_streams_are_the_users_stream_class(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    helpers.write_elastic(remote, range(40))
    streams_registry.register("tagged_compat", func=TaggedStream)
    ds = StreamingDataset(remote=str(remote), local=str(tmp_path / "a"), stream_name="tagged_compat",
                          stream_config={"tag": "web"}, batch_size=4)
    assert isinstance(ds.streams[0], TaggedStream) and ds.streams[0].tag == "web"
    assert not isinstance(StreamingDataset(remote=str(remote), local=str(tmp_path / "b"), batch_size=4).streams[0],
                          TaggedStream)
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker gets
    assert isinstance(copy.streams[0], TaggedStream) and copy.streams[0].tag == "web"
    assert [int(s["id"]) for s in copy] == list(range(40))


def test_world_as_mosaicml_constructs_it() -> None:
    w = World(num_nodes=2, ranks_per_node=4, workers_per_rank=8, worker=45)
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size, w.worker_id, w.num_workers) == (5, 8, 1, 4, 5, 8)
    assert (w.num_nodes, w.node, w.num_ranks, w.ranks_per_node, w.rank_of_node, w.workers_per_rank) == (2, 1, 8, 4, 1, 8)
    assert (w.worker, w.worker_of_rank, w.worker_of_node, w.workers_per_node, w.num_workers_total) == (45, 5, 13, 32, 64)
    assert (w.is_multinode, w.is_leader, w.is_local_leader) == (True, False, False)
    assert World(num_nodes=1, ranks_per_node=1, workers_per_rank=1, worker=0) == World()
    with pytest.raises(ValueError, match="all four"):
        World(num_nodes=2, ranks_per_node=4)
    with pytest.raises(ValueError, match="rank 8 is outside world size 8"):
        World(num_nodes=2, ranks_per_node=4, workers_per_rank=1, worker=8)


def test_index_errors_are_the_exceptions_mosaicml_raises(tmp_path: Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    (local / "index.json").write_text("")
    with pytest.raises(json.JSONDecodeError, match=r"index.json: not valid JSON: Expecting value \(line 1") as caught:
        StreamingDataset(local=str(local), batch_size=1)
    assert isinstance(caught.value, IndexFormatError) and (caught.value.lineno, caught.value.colno) == (1, 1)
    (local / "index.json").write_text(json.dumps({"shards": [], "version": 2}))
    with pytest.raises(RuntimeError, match=r"index.json: Stream contains no samples: 0 shards") as empty:
        StreamingDataset(local=str(local), batch_size=1)
    assert isinstance(empty.value, IndexFormatError)


def test_generate_work_is_the_order_each_worker_reads(tmp_path: Path) -> None:
    root = helpers.write_two_streams(tmp_path / "remote")
    streams = [Stream(remote=str(root / name), local=str(tmp_path / name)) for name in ("A", "B")]
    ds = StreamingDataset(streams=streams, batch_size=4, shuffle=True, num_canonical_nodes=2)
    alone = generate_work("random", ds, World(), 0, 0)
    assert alone.shape == (1, 1, 1, -(-len(ds) // 4), 4)
    order = alone.reshape(-1)
    assert helpers.two_stream_ids(order[order >= 0]) == [int(s["id"]) for s in ds]
    work = generate_work("device_per_stream", ds, World(num_nodes=2, ranks_per_node=2, workers_per_rank=3, worker=0),
                         0, 0)
    assert work.shape[:3] == (2, 2, 3) and work.shape[4] == 4
    batches = [b for b in work.reshape(-1, 4) if (b >= 0).any()]
    assert all(len({int(i) < helpers.N_A for i in b}) == 1 for b in batches)  # each device batch from one stream
    assert {int(i) for b in batches for i in b} == set(range(helpers.N_A + helpers.N_B))
