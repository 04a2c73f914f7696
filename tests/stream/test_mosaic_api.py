"""MosaicML Streaming's dataset API on Tessera's StreamingDataset, checked against the anchor itself.

Ported in our own words from MosaicML's tests (test_array.py, test_mixing.py, test_stream.py,
test_streaming.py, test_registry.py): `ds[...]` with every index kind (numpy's rules), `ds.shards` and
the layout attributes, the resolved weights written back onto each Stream, `stream_name`/`stream_config`,
the state_dict keys both ways, and a cached index.json used when the remote has none. Where the anchor
can answer (same data, same call), the answer is compared with its answer.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.shards import ShardWriter
from tessera.shards.errors import DatasetNotFound
from tessera.stream import Stream, StreamingDataLoader, StreamingDataset, streams_registry
from tessera.stream.indexing import select

N = 100  # samples in the "seq" dataset: value i at global index i


@pytest.fixture(scope="module")
def mosaic() -> Any:
    import anchors  # noqa: F401  (the torchvision stand-in, before `streaming` is imported)
    import streaming

    return streaming


def write_values(out: Path, values: range, size_limit: int = 1 << 8, compression: str | None = None) -> Path:
    with ShardWriter(out, {"value": "int", "s": "str"}, size_limit=size_limit, compression=compression,
                     hashes=["sha1"]) as w:
        for v in values:
            w.write({"value": v, "s": "x" * (v % 7)})
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mosaic_api")
    out = {"seq": write_values(root / "seq", range(N)),
           "zstd": write_values(root / "zstd", range(40), compression="zstd")}
    for i in range(4):  # MosaicML's test_mixing layout: stream i holds values 2i, 2i+1
        out[f"mix{i}"] = write_values(root / f"mix{i}", range(2 * i, 2 * i + 2))
    return out


@pytest.fixture(scope="module")
def seq(data: dict[str, Path]) -> StreamingDataset:
    return StreamingDataset(local=str(data["seq"]), batch_size=1)


def values(items: Any) -> Any:
    """Samples -> their values, keeping list nesting."""
    return [values(x) for x in items] if isinstance(items, list) else int(items["value"])


# --- ds[...] as MosaicML's Array (its test_array.py compares with numpy) -------------------------------
def same_as_numpy(ds: StreamingDataset, index: Any) -> None:
    try:
        want: Any = np.arange(N)[index]
    except IndexError:
        with pytest.raises(IndexError, match="out of range"):
            ds[index]
        return
    got = ds[index]
    assert values(got) == (want.tolist() if isinstance(want, np.ndarray) else int(want))


ENDS = st.none() | st.integers(-30, 30)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 20), ENDS, ENDS, st.none() | st.integers(-5, 5).filter(bool), st.lists(st.integers(-25, 25)))
def test_select_names_numpys_items_for_any_slice_and_list(size: int, start, stop, step, picks: list[int]) -> None:
    items = np.arange(size) * 10
    assert select(slice(start, stop, step), size, lambda i: int(items[i])) == items[start:stop:step].tolist()
    try:
        want = items[picks].tolist()
    except IndexError:
        with pytest.raises(IndexError, match="out of range"):
            select(picks, size, lambda i: int(items[i]))
    else:
        assert select(picks, size, lambda i: int(items[i])) == want
        assert select(np.array(picks, dtype=np.int64), size, lambda i: int(items[i])) == want


def test_int_indices_from_the_front_and_back_and_out_of_range(seq: StreamingDataset) -> None:
    for i in list(range(-3 * N, 3 * N, 7)) + [-N - 1, -N, -1, 0, N - 1, N, np.int64(-2), np.uint8(5)]:
        same_as_numpy(seq, i)


@pytest.mark.parametrize("step", [-3, -1, 1, 3])
def test_slices_name_numpys_indices(seq: StreamingDataset, step: int) -> None:
    ends = [None, -142, -100, -99, -42, -1, 0, 42, 99, 100, 142]
    for start in ends:
        for stop in ends:
            same_as_numpy(seq, slice(start, stop, step))


def test_lists_and_arrays_of_indices_nest_as_given(seq: StreamingDataset) -> None:
    same_as_numpy(seq, [5, -1, 0, 5])
    same_as_numpy(seq, np.array([[1, 2], [-3, 99]]))
    same_as_numpy(seq, [])
    assert values(seq[[1, [2, [3]]]]) == [1, [2, [3]]]  # ragged nesting, as MosaicML's recursion gives
    same_as_numpy(seq, [3, N])  # one bad index fails the whole call


@pytest.mark.parametrize("bad", ["3", 2.0, None, True, np.array([1.0]), np.array([True]), (1, 2)])
def test_other_index_kinds_are_a_value_and_type_error(seq: StreamingDataset, bad: Any) -> None:
    with pytest.raises(ValueError, match=r"dataset\[") as err:
        seq[bad]
    assert isinstance(err.value, TypeError)


def test_get_item_is_the_raw_read_and_subclasses_transform_in_getitem(data: dict[str, Path]) -> None:
    class Doubled(StreamingDataset):
        def __getitem__(self, at: Any) -> Any:
            sample = super().__getitem__(at)
            return {**sample, "value": 2 * int(sample["value"])}

    ds = Doubled(local=str(data["seq"]))
    assert ds[7]["value"] == 14 and ds[-1]["value"] == 2 * (N - 1) and ds.get_item(7)["value"] == 7
    with pytest.raises(IndexError, match="sample index -1 is out of range for a dataset of 100 samples"):
        ds.get_item(-1)


# --- the shards and layout attributes, against MosaicML's on the same data --------------------------
def layout(ds: Any) -> dict[str, Any]:
    names = ["num_samples", "size", "epoch_size", "num_streams", "num_shards", "samples_per_shard",
             "sample_offset_per_shard", "shards_per_stream", "shard_offset_per_stream", "samples_per_stream",
             "sample_offset_per_stream", "stream_per_shard"]
    out = {n: np.asarray(getattr(ds, n)).tolist() for n in names}
    out["shards"] = [(s.samples, len(s), s.size, s.compression, s.hashes, s.size_limit, s.get_raw_size(),
                      s.get_zip_size(), s.get_max_size(), s.get_persistent_size(True),
                      s.get_persistent_size(False), s.column_names, s.column_encodings, s.column_sizes,
                      s.split, [(r.basename, r.bytes, r.hashes, z and (z.basename, z.bytes, z.hashes))
                                for r, z in s.file_pairs]) for s in ds.shards]
    return out


@pytest.mark.parametrize("names", [["seq"], ["zstd"], ["mix0", "zstd", "mix3"]])
def test_layout_attributes_and_shards_are_mosaics(mosaic: Any, data: dict[str, Path], names: list[str],
                                                  tmp_path: Path) -> None:
    ours = StreamingDataset(streams=[Stream(local=str(data[n])) for n in names], batch_size=2)
    theirs = mosaic.StreamingDataset(streams=[mosaic.Stream(local=str(data[n])) for n in names], batch_size=2)
    assert layout(ours) == layout(theirs)
    for shard in (0, ours.num_shards - 1):
        assert values(ours.shards[shard][1:]) == values(theirs.shards[shard][1:])  # (its [::-1] is [])
        assert ours.shards[shard].get_sample_data(0) == theirs.shards[shard].get_sample_data(0)
    picks = np.array([0, ours.num_samples - 1, 3])
    assert values(ours[picks]) == values(theirs[picks])
    assert ours.shards[-1].dirname == str(data[names[-1]]) and len(ours.shards[1:3]) == 2


def test_shard_reads_are_bounded_by_the_shard(seq: StreamingDataset) -> None:
    shard = seq.shards[1]
    with pytest.raises(IndexError, match=rf"sample index {shard.samples} is out of range for shard 1 "):
        shard.get_item(shard.samples)
    assert values(shard[-1]) == int(seq.sample_offset_per_shard[2]) - 1
    assert values(list(shard)) == list(range(int(seq.sample_offset_per_shard[1]), int(seq.sample_offset_per_shard[2])))
    with pytest.raises(IndexError):
        seq.shards[seq.num_shards]


def test_prepare_shard_puts_the_shard_in_the_cache(data: dict[str, Path], tmp_path: Path) -> None:
    ds = StreamingDataset(remote=str(data["zstd"]), local=str(tmp_path / "cache"))
    raw = tmp_path / "cache" / ds.shards[2].raw_data.basename
    assert not raw.exists()
    ds.prepare_shard(2)
    assert raw.read_bytes() == _decompressed(data["zstd"], ds.shards[2])
    with pytest.raises(IndexError, match="shard 99 is out of range"):
        ds.prepare_shard(99)


def _decompressed(root: Path, shard: Any) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor().decompress((root / shard.zip_data.basename).read_bytes())


# --- weights written back onto the Streams (MosaicML's test_mixing.py) ----------------------------------
MIXES = [  # (weights per stream, epoch_size, expected (proportion, repeat, choose) per stream)
    ([{}, {}, {}, {}], None, [(0.25, 1, 2)] * 4),
    ([{"choose": 2}] * 4, None, [(0.25, 1, 2)] * 4),
    ([{"choose": 4}] * 4, None, [(0.25, 2, 4)] * 4),
    ([{"choose": c} for c in (0, 2, 4, 6)], None, [(i / 6, i, 2 * i) for i in range(4)]),
    ([{"repeat": r} for r in (0, 1, 2, 3)], None, [(i / 6, i, 2 * i) for i in range(4)]),
    ([{"proportion": p} for p in (1, 1, 2, 4)], None, [(1 / 8, 0.5, 1), (1 / 8, 0.5, 1), (0.25, 1, 2), (0.5, 2, 4)]),
    ([{"proportion": p} for p in (0, 1, 1, 2)], 12, [(0, 0, 0), (0.25, 1.5, 3), (0.25, 1.5, 3), (0.5, 3, 6)]),
    ([{}, {}, {}, {}], 4, [(0.25, 0.5, 1)] * 4),
]


@pytest.mark.parametrize(("weights", "epoch_size", "want"), MIXES)
def test_resolved_weights_are_written_back_as_mosaic_does(mosaic: Any, data: dict[str, Path], weights: list[dict],
                                                          epoch_size: int | None, want: list[tuple]) -> None:
    ours = [Stream(local=str(data[f"mix{i}"]), **w) for i, w in enumerate(weights)]
    theirs = [mosaic.Stream(local=str(data[f"mix{i}"]), **w) for i, w in enumerate(weights)]
    ds = StreamingDataset(streams=ours, epoch_size=epoch_size, num_canonical_nodes=1, batch_size=1)
    mosaic.StreamingDataset(streams=theirs, epoch_size=epoch_size, num_canonical_nodes=1, batch_size=1)
    for mine, anchor, (p, r, c) in zip(ours, theirs, want, strict=True):
        assert (mine.proportion, mine.repeat, mine.choose) == pytest.approx((p, r, c))
        assert (mine.proportion, mine.repeat, mine.choose) == pytest.approx((anchor.proportion, anchor.repeat,
                                                                             anchor.choose))
        assert isinstance(mine.choose, int) and isinstance(mine.proportion, float)
    assert ds.epoch_size == sum(c for _, _, c in want)
    assert [st.proportion for st in ds.streams] == [s.proportion for s in ours]  # ds.streams[i] reads the Stream


def test_written_back_streams_build_another_dataset_with_the_given_weights(data: dict[str, Path]) -> None:
    streams = [Stream(local=str(data["mix0"]), repeat=2), Stream(local=str(data["mix1"]))]
    first = StreamingDataset(streams=streams)
    again = StreamingDataset(streams=streams)  # MosaicML refuses this: all three weights are set by now
    assert first.epoch_size == again.epoch_size == 6
    assert again._run.fingerprint == first._run.fingerprint


def test_an_unshuffled_mix_walks_streams_and_repeats_in_order(data: dict[str, Path]) -> None:
    """MosaicML's test_mixing walks: one process, shuffle off, one canonical node."""
    def walk(weights: list[dict]) -> list[int]:
        streams = [Stream(local=str(data[f"mix{i}"]), **w) for i, w in enumerate(weights)]
        return [int(s["value"]) for s in StreamingDataset(streams=streams, num_canonical_nodes=1, batch_size=1)]

    assert walk([{}] * 4) == list(range(8))
    assert walk([{"choose": 4}] * 4) == [0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7]
    assert walk([{"choose": c} for c in (0, 2, 4, 6)]) == [2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7]


# --- stream_name / stream_config (MosaicML's test_custom_stream_name_and_kwargs) -------------------------
@dataclasses.dataclass
class TaggedStream(Stream):
    custom_arg: int = 0


def test_a_registered_stream_class_builds_the_datasets_stream(data: dict[str, Path]) -> None:
    streams_registry.register("tagged_stream_test", func=TaggedStream)
    assert "tagged_stream_test" in streams_registry
    ds = StreamingDataset(local=str(data["seq"]), stream_name="tagged_stream_test",
                          stream_config={"custom_arg": 100, "local": "ignored: the dataset's local wins"})
    assert len(ds.streams) == 1 and isinstance(ds.streams[0].spec, TaggedStream)
    assert ds.streams[0].custom_arg == 100 and ds.streams[0].local == str(data["seq"])
    assert values(ds[3]) == 3


def test_stream_name_errors_name_the_problem(data: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="stream_name='nope' is not registered; registered: .*'stream'"):
        StreamingDataset(local=str(data["seq"]), stream_name="nope")
    streams_registry.register("not_a_stream_test", func=lambda **kw: kw)
    with pytest.raises(ValueError, match="built a dict, not a tessera.stream.Stream"):
        StreamingDataset(local=str(data["seq"]), stream_name="not_a_stream_test")
    with pytest.raises(ValueError, match="with streams=\\[...\\] construct those Streams yourself"):
        StreamingDataset(streams=[Stream(local=str(data["seq"]))], stream_config={"custom_arg": 1})


# --- resume state keys, both ways ------------------------------------------------------------------
def three_batches_then_state(loader: Any) -> dict[str, Any]:
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    return loader.state_dict()


def test_loader_state_has_mosaics_keys_and_values(mosaic: Any, data: dict[str, Path]) -> None:
    ours = three_batches_then_state(StreamingDataLoader(
        StreamingDataset(local=str(data["seq"]), batch_size=4, num_canonical_nodes=1), batch_size=4))
    theirs = three_batches_then_state(mosaic.StreamingDataLoader(
        mosaic.StreamingDataset(local=str(data["seq"]), batch_size=4, num_canonical_nodes=1), batch_size=4))
    assert theirs == {"epoch": 0, "sample_in_epoch": 12, "num_canonical_nodes": 1, "shuffle_seed": 9176,
                      "initial_physical_nodes": 1}
    assert {k: ours[k] for k in theirs} == theirs
    assert ours["samples_consumed"] == 12 and ours["format"].startswith("tessera")


def test_a_mosaic_state_resumes_where_it_says(mosaic: Any, data: dict[str, Path]) -> None:
    theirs = three_batches_then_state(mosaic.StreamingDataLoader(mosaic.StreamingDataset(
        local=str(data["seq"]), batch_size=4, num_canonical_nodes=1, shuffle=True), batch_size=4))
    fresh = StreamingDataset(local=str(data["seq"]), batch_size=4, num_canonical_nodes=1, shuffle=True)
    whole = values(list(fresh))
    resumed = StreamingDataset(local=str(data["seq"]), batch_size=4, shuffle=True)
    resumed.load_state_dict({**theirs, "initial_physical_nodes": 3})
    assert values(list(resumed)) == whole[12:]
    assert resumed.state_dict(0, from_beginning=False)["initial_physical_nodes"] == 3  # kept, as MosaicML


def test_a_mosaic_state_from_before_the_first_epoch_starts_at_the_beginning(mosaic: Any,
                                                                            data: dict[str, Path]) -> None:
    theirs = mosaic.StreamingDataset(local=str(data["seq"]), batch_size=4).state_dict(0, True)
    assert theirs["epoch"] == -1  # MosaicML's epoch counter before any iteration
    ds = StreamingDataset(local=str(data["seq"]), batch_size=4)
    ds.load_state_dict(theirs)
    assert values(list(ds)) == list(range(N))


def test_a_tessera_state_resumes_mosaic(mosaic: Any, data: dict[str, Path]) -> None:
    ds = StreamingDataset(local=str(data["seq"]), batch_size=4, num_canonical_nodes=1)
    anchor = mosaic.StreamingDataset(local=str(data["seq"]), batch_size=4, num_canonical_nodes=1)
    anchor.load_state_dict(ds.state_dict(40, from_beginning=True))
    assert sorted(values(list(anchor))) == list(range(40, N))


# --- a cached index.json when the remote has none (MosaicML reads a cached one) ------------------------
def test_a_cached_index_is_used_when_the_remote_has_none(data: dict[str, Path], tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    shutil.copytree(data["zstd"], remote)
    want = values(StreamingDataset(remote=str(remote), local=str(tmp_path / "cache"))[:])
    (remote / "index.json").unlink()
    with pytest.warns(UserWarning, match=r"index.json: NotFound: .*using the index.json cached at"):
        ds = StreamingDataset(remote=str(remote), local=str(tmp_path / "cache"))
    assert values(ds[:]) == want == list(range(40))
    with pytest.raises(DatasetNotFound, match="no index.json; is the remote URL right"):
        StreamingDataset(remote=str(remote), local=str(tmp_path / "other"))


def test_one_relative_remote_in_two_folders_is_two_caches(data: dict[str, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`./data` in two project folders names two datasets: the default cache folder follows the absolute
    path, so the second never reads the first one's index or its equally sized shards."""
    for name, source in (("a", data["seq"]), ("b", data["zstd"])):
        shutil.copytree(source, tmp_path / name / "data")
    monkeypatch.chdir(tmp_path / "a")
    first = StreamingDataset(remote="./data")
    monkeypatch.chdir(tmp_path / "b")
    second = StreamingDataset(remote="./data")
    assert first.streams[0].local != second.streams[0].local
    (tmp_path / "c" / "data").mkdir(parents=True)  # a third folder with no dataset: no other cache stands in
    monkeypatch.chdir(tmp_path / "c")
    with pytest.raises(DatasetNotFound):
        StreamingDataset(remote="./data")
