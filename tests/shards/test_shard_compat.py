"""Compatibility with mosaicml-streaming 0.13, both ways, and byte identity with its MDSWriter."""

from __future__ import annotations

import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import anchors  # (registers the torchvision stand-in, then imports streaming)
import numpy as np
import pytest
from PIL import Image
from streaming import CSVWriter, JSONWriter, TSVWriter, XSVWriter

from tessera.shards import MDSDataset, ShardWriter, repair_index

ALL_ENCODINGS = {
    "bytes": "bytes", "str": "str", "int": "int", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64", "f16": "float16", "f32": "float32",
    "f64": "float64", "sint": "str_int", "sfloat": "str_float", "sdec": "str_decimal", "json": "json",
    "pkl": "pkl", "pil": "pil", "jpeg": "jpeg", "png": "png", "lpil": "list[pil]", "ljpeg": "list[jpeg]",
    "lpng": "list[png]", "jarr": "jpeg_array", "jarr2": "jpegarray", "nd": "ndarray", "nd_dtype": "ndarray:int16",
    "nd_static": "ndarray:float32:2,3",
}


def _jpeg_bytes(color: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (5, 4), (color, 255 - color, 7)).save(out, format="JPEG")
    return out.getvalue()


def every_encoding_sample(i: int) -> dict[str, Any]:
    image = Image.fromarray(np.full((3, 4, 3), i * 9 % 256, np.uint8), "RGB")
    return {
        "bytes": bytes([i]) * i, "str": "é" * i, "int": -(2**40) + i, "i8": -i, "i16": 300 * i, "i32": -(2**30) + i,
        "i64": 2**62 - i, "u8": 255 - i, "u16": 60000 + i, "u32": 2**32 - 1 - i, "u64": 2**64 - 1 - i,
        "f16": 0.5 * i, "f32": 1.25 * i, "f64": 1e300 / (i + 1), "sint": 10**30 + i, "sfloat": i / 7,
        "sdec": Decimal("1.000000000000000000001") * i, "json": {"i": i, "l": [i, None, "x"]},
        "pkl": {"set": {i, i + 1}}, "pil": image, "jpeg": image, "png": image, "lpil": [image] * (i % 3),
        "ljpeg": [image], "lpng": [image, image], "jarr": [_jpeg_bytes(i)], "jarr2": [_jpeg_bytes(i), _jpeg_bytes(3)],
        "nd": np.arange(i + 1, dtype=np.float64).reshape(1, -1), "nd_dtype": np.full((2, i + 1), i, np.int16),
        "nd_static": np.full((2, 3), i / 3, np.float32),
    }


def assert_same(ours: Any, theirs: Any, where: str) -> None:
    if isinstance(theirs, Image.Image):
        assert isinstance(ours, Image.Image), where
        assert (ours.mode, ours.size, ours.tobytes()) == (theirs.mode, theirs.size, theirs.tobytes()), where
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), where
        for a, b in zip(ours, theirs, strict=True):
            assert_same(a, b, where)
    elif isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray) and ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        assert ours.tobytes() == theirs.tobytes(), where
    elif isinstance(theirs, np.generic):
        assert type(ours) is type(theirs) and ours.tobytes() == theirs.tobytes(), where
    else:
        assert type(ours) is type(theirs) and ours == theirs, where


def streaming_samples(folder: Path, **kwargs: Any) -> list[dict[str, Any]]:
    anchors.clean_stale_shared_memory()
    dataset = anchors.StreamingDataset(local=str(folder), remote=None, shuffle=False, batch_size=1, **kwargs)
    return [dataset[i] for i in range(dataset.num_samples)]


def assert_datasets_agree(ours: MDSDataset, theirs: list[dict[str, Any]]) -> None:
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.keys() == b.keys()
        for name in b:
            assert_same(a[name], b[name], f"sample {i} column {name}")


def write_mds(folder: Path, n: int, columns: dict[str, str], make: Any, **kwargs: Any) -> None:
    with anchors.MDSWriter(out=str(folder), columns=columns, **kwargs) as writer:
        for i in range(n):
            writer.write(make(i))


def write_ours(folder: Path, n: int, columns: dict[str, str], make: Any, **kwargs: Any) -> None:
    with ShardWriter(folder, columns, **kwargs) as writer:
        for i in range(n):
            writer.write(make(i))


def test_mdswriter_every_encoding_reads_identically(tmp_path: Path) -> None:
    write_mds(tmp_path, 12, ALL_ENCODINGS, every_encoding_sample, size_limit=20_000)
    ours = MDSDataset(tmp_path, allow_unsafe_types=True)
    assert ours.num_shards > 1
    assert_datasets_agree(ours, streaming_samples(tmp_path, allow_unsafe_types=True))
    sample = ours[5]  # and against the input itself, where decoding is lossless
    expected = every_encoding_sample(5)
    for name in ("bytes", "str", "int", "sint", "sdec", "json", "pkl", "nd", "nd_static"):
        assert_same(sample[name], expected[name] if name != "nd_static" else expected[name], name)
    assert sample["u64"] == np.uint64(2**64 - 6) and sample["f16"] == np.float16(2.5)


def test_shardwriter_every_encoding_reads_identically_in_streaming(tmp_path: Path) -> None:
    write_ours(tmp_path, 12, ALL_ENCODINGS, every_encoding_sample, size_limit=20_000)
    ours = MDSDataset(tmp_path, allow_unsafe_types=True)
    assert_datasets_agree(ours, streaming_samples(tmp_path, allow_unsafe_types=True))


COMPRESSIONS = ["br", "br:1", "bz2", "bz2:1", "gz", "gz:1", "snappy", "zstd", "zstd:1", "zstd:19"]
HASH_SETS = [["md5", "sha256"], ["xxh3_64", "xxh64"], ["blake2b", "sha1", "xxh128", "xxh32", "xxh3_128"]]
TOKENS = {"tokens": "ndarray:uint16:32", "id": "int", "text": "str"}


def token_sample(i: int) -> dict[str, Any]:
    return {"tokens": (np.arange(32, dtype=np.uint16) * i) % 1000, "id": i, "text": "t" * (i % 9)}


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_mdswriter_compressed_and_hashed_reads_identically(tmp_path: Path, compression: str) -> None:
    hashes = HASH_SETS[COMPRESSIONS.index(compression) % len(HASH_SETS)]
    folder = tmp_path / "ds"
    write_mds(folder, 200, TOKENS, token_sample, compression=compression, hashes=hashes, size_limit=4000)
    ours = MDSDataset(folder, cache_dir=tmp_path / "cache", verify_hashes=True)
    assert ours.num_shards > 2
    assert_datasets_agree(ours, streaming_samples(folder))


@pytest.mark.parametrize("compression", ["br:3", "bz2", "gz", "snappy", "zstd:3"])
def test_shardwriter_compressed_reads_in_streaming(tmp_path: Path, compression: str) -> None:
    folder = tmp_path / "ds"
    write_ours(folder, 200, TOKENS, token_sample, compression=compression, hashes=["sha1"], size_limit=4000)
    ours = MDSDataset(folder, cache_dir=tmp_path / "cache")
    assert_datasets_agree(ours, streaming_samples(folder, validate_hash="sha1"))


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize(
    ("compression", "hashes", "size_limit"),
    [(None, None, None), (None, ["sha1", "xxh64"], 3000), ("br", ["md5"], 20000), ("bz2:3", None, 3000),
     ("snappy", ["xxh3_128"], 3000), ("zstd", ["sha256", "xxh64"], 3000), ("zstd:7", None, "8kb"),
     (None, None, 300)],
)
def test_byte_identical_to_mdswriter(tmp_path: Path, compression: str | None, hashes: list | None,
                                     size_limit: Any) -> None:
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    write_mds(theirs, 60, ALL_ENCODINGS, every_encoding_sample_small, compression=compression, hashes=hashes,
              size_limit=size_limit)
    write_ours(ours, 60, ALL_ENCODINGS, every_encoding_sample_small, compression=compression, hashes=hashes,
               size_limit=size_limit)
    assert _files(ours) == _files(theirs)


def every_encoding_sample_small(i: int) -> dict[str, Any]:
    return every_encoding_sample(i % 20)


def test_gzip_differs_only_in_the_gzip_header(tmp_path: Path) -> None:
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    write_mds(theirs, 60, TOKENS, token_sample, compression="gz", size_limit=3000)
    write_ours(ours, 60, TOKENS, token_sample, compression="gz", size_limit=3000)
    a, b = _files(theirs), _files(ours)
    assert a.keys() == b.keys()
    import gzip

    for name in a:
        if name.endswith(".gz"):
            assert gzip.decompress(a[name]) == gzip.decompress(b[name])


def test_empty_first_shard_quirk_both_ways(tmp_path: Path) -> None:
    big = {"b": "bytes"}
    write_mds(tmp_path / "theirs", 3, big, lambda i: {"b": b"z" * (500 + i)}, size_limit=300)
    write_ours(tmp_path / "ours", 3, big, lambda i: {"b": b"z" * (500 + i)}, size_limit=300)
    assert _files(tmp_path / "ours") == _files(tmp_path / "theirs")
    ds = MDSDataset(tmp_path / "theirs")
    assert [e.samples for e in ds.index.shards] == [0, 1, 1, 1]
    assert_datasets_agree(ds, streaming_samples(tmp_path / "ours"))


@pytest.mark.parametrize(
    ("writer", "columns"),
    [
        (JSONWriter, {"id": "int", "text": "str", "score": "float"}),
        (CSVWriter, {"id": "int", "text": "str", "score": "float"}),
        (TSVWriter, {"id": "int", "text": "str", "score": "float"}),
        (XSVWriter, {"id": "int", "text": "str", "score": "float"}),
    ],
)
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_text_formats_read_identically(tmp_path: Path, writer: Any, columns: dict, compression: str | None) -> None:
    folder = tmp_path / "ds"
    extra = {"separator": "|"} if writer is XSVWriter else {}
    with writer(out=str(folder), columns=columns, compression=compression, size_limit=600, hashes=["xxh64"],
                **extra) as out:
        for i in range(60):
            out.write({"id": i, "text": f"row {i}", "score": i / 8})
    ours = MDSDataset(folder, cache_dir=tmp_path / "cache", verify_hashes=True)
    assert ours.num_shards > 1 and ours[7] == {"id": 7, "text": "row 7", "score": 7 / 8}
    assert ours.get_batch([3, 59])["text"] == ["row 3", "row 59"]
    original = (folder / "index.json").read_bytes()
    (folder / "index.json").unlink()
    repair_index(folder)  # the .meta files embed the config: the index comes back byte for byte
    assert (folder / "index.json").read_bytes() == original
    assert_datasets_agree(ours, streaming_samples(folder))
