"""download() / upload() / split_url(): atomic, verified whole-object transfers on every backend."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from tessera.storage import (
    IntegrityError,
    InvalidURL,
    NotFound,
    RetryPolicy,
    download,
    open_store,
    split_url,
    upload,
)

BIG = 64 << 20


def xxh64_of(data: bytes) -> tuple[str, str]:
    return ("xxh64", xxhash.xxh64(data).hexdigest())


def xxh64_file(path: Path) -> str:
    h = xxhash.xxh64()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def entries(folder: Path) -> list[str]:
    """Everything in `folder`, hidden temp files included."""
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def store(any_store_url):
    return open_store(any_store_url)


@pytest.fixture
def dl(tmp_path) -> Path:
    """An empty destination folder (apart from any local store's root)."""
    folder = tmp_path / "dl"
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> tuple[Path, str]:
    """64 MiB of random bytes on disk and their xxh64."""
    path = tmp_path_factory.mktemp("big") / "big.bin"
    data = os.urandom(BIG)
    path.write_bytes(data)
    return path, xxhash.xxh64(data).hexdigest()


# --- small objects, every backend ------------------------------------------------------------------


def test_download_round_trip(store, dl):
    data = os.urandom(300_000)
    store.put("d/obj.bin", data)
    dest = dl / "out" / "nested" / "obj.bin"
    assert download(store.url_for("d/obj.bin"), dest) == len(data)
    assert dest.read_bytes() == data
    assert entries(dest.parent) == ["obj.bin"]


def test_download_with_size_and_hash(store, dl):
    data = b"verified bytes" * 1000
    store.put("v.bin", data)
    dest = dl / "v.bin"
    n = download(store.url_for("v.bin"), dest, size=len(data), hash=xxh64_of(data),
                 retry=RetryPolicy(max_attempts=2))
    assert n == len(data)
    assert dest.read_bytes() == data


def test_download_empty_object(store, dl):
    store.put("empty", b"")
    dest = dl / "empty"
    assert download(store.url_for("empty"), dest, hash=xxh64_of(b"")) == 0
    assert dest.read_bytes() == b""


def test_download_replaces_existing_file(store, dl):
    store.put("k", b"new content")
    dest = dl / "k"
    dest.write_bytes(b"old content that is longer")
    download(store.url_for("k"), dest)
    assert dest.read_bytes() == b"new content"


def test_download_missing_object(store, dl):
    dest = dl / "never.bin"
    url = store.url_for("no/such/object.bin")
    with pytest.raises(NotFound) as info:
        download(url, dest)
    assert url in str(info.value)
    assert entries(dl) == []


def test_hash_mismatch_leaves_no_file(store, dl):
    data = os.urandom(10_000)
    store.put("h.bin", data)
    dest = dl / "h.bin"
    with pytest.raises(IntegrityError) as info:
        download(store.url_for("h.bin"), dest, hash=("xxh64", "0123456789abcdef"))
    assert store.url_for("h.bin") in str(info.value)
    assert entries(dl) == []


def test_failed_download_keeps_previous_file(store, dl):
    store.put("h.bin", b"remote bytes")
    dest = dl / "h.bin"
    dest.write_bytes(b"what was there")
    with pytest.raises(IntegrityError):
        download(store.url_for("h.bin"), dest, hash=("xxh64", "0123456789abcdef"))
    assert dest.read_bytes() == b"what was there"
    assert entries(dl) == ["h.bin"]


@pytest.mark.parametrize("delta", [+1, -1])
def test_size_mismatch_is_integrity_error(store, dl, delta):
    data = os.urandom(5000)
    store.put("s.bin", data)
    dest = dl / "s.bin"
    with pytest.raises(IntegrityError):
        download(store.url_for("s.bin"), dest, size=len(data) + delta)
    assert entries(dl) == []


def test_upload_round_trip(store, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"uploaded" * 500)
    upload(src, store.url_for("up/src.bin"))
    assert store.get("up/src.bin") == src.read_bytes()


def test_split_url():
    assert split_url("s3://b/p/k.bin") == ("s3://b/p", "k.bin")
    assert split_url("s3://b/k.bin") == ("s3://b", "k.bin")
    assert split_url("memory://m/a/b") == ("memory://m/a", "b")
    assert split_url("/a/b/c") == ("/a/b", "c")
    with pytest.raises(InvalidURL):
        split_url("s3://bucket-only")
    with pytest.raises(InvalidURL):
        split_url("s3://b/../k")


# --- 64 MiB through S3: multipart upload, concurrent ranged download ---------------------------------


def test_big_object_round_trips_byte_exact(s3_bucket, big_file, dl):
    path, digest = big_file
    store = open_store(s3_bucket)
    store.put_file("big/random.bin", path)
    info = store.head("big/random.bin")
    assert info.size == BIG
    assert info.etag and "-" in info.etag, f"expected a multipart ETag (md5-N), got {info.etag}"

    dest = dl / "random.bin"
    assert download(store.url_for("big/random.bin"), dest, size=BIG, hash=("xxh64", digest)) == BIG
    assert xxh64_file(dest) == digest
    assert entries(dl) == ["random.bin"]

    # Ranged reads across part boundaries agree with the source too.
    src = path.read_bytes()
    ranges = [(0, 10), ((8 << 20) - 5, (8 << 20) + 5), (BIG - 100, BIG)]
    assert store.get_ranges("big/random.bin", ranges) == [src[s:e] for s, e in ranges]


def test_big_object_hash_mismatch_leaves_no_file(s3_bucket, big_file, dl):
    path, digest = big_file
    upload(path, f"{s3_bucket}/big.bin")
    dest = dl / "big.bin"
    wrong = ("xxh64", format(int(digest, 16) ^ 1, "016x"))
    with pytest.raises(IntegrityError):
        download(f"{s3_bucket}/big.bin", dest, hash=wrong)
    assert entries(dl) == []
    with pytest.raises(IntegrityError):
        download(f"{s3_bucket}/big.bin", dest, size=BIG + 1)
    assert entries(dl) == []
